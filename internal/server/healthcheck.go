package server

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
)

// HealthCommand is the subcommand every service answers with a health
// check of its own listener: what an image's HEALTHCHECK runs (see
// deploy/images), where there is no curl.
const HealthCommand = "healthcheck"

// HealthCheck asks the service listening on addr (a bare port means
// 127.0.0.1) whether it serves, with the gRPC health protocol, over h2c or,
// if that fails, TLS. The TLS certificate is not verified: the probe runs
// beside the service and checks it answers, not who it is. It writes what
// it found to w and returns an error unless the service serves.
func HealthCheck(ctx context.Context, addr string, w io.Writer) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("health check: address %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	hostport := net.JoinHostPort(host, port)
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	plain := NewClient()
	probe := &http.Client{Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // a probe of the service beside it, see above
		ForceAttemptHTTP2: true,
	}}
	var last error
	for _, try := range []struct {
		scheme string
		c      *http.Client
	}{{"http", plain}, {"https", probe}} {
		checker := grpchealth.NewClient(try.c, try.scheme+"://"+hostport, connect.WithGRPC())
		res, err := checker.Check(ctx, &grpchealth.CheckRequest{})
		if err != nil {
			last = err
			continue
		}
		fmt.Fprintf(w, "%s://%s: %s\n", try.scheme, hostport, res.Status)
		if res.Status != grpchealth.StatusServing {
			return fmt.Errorf("health check: %s", res.Status)
		}
		return nil
	}
	return fmt.Errorf("health check of %s: %w", hostport, last)
}

// RunHealthCheck is a service's `healthcheck [--addr ADDR]` subcommand: it
// checks the service at --addr, which defaults like the service's own
// (defaultAddr, or the variable env).
func RunHealthCheck(ctx context.Context, name string, args []string, defaultAddr, env string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet(name+" "+HealthCommand, flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", defaultAddr, "address the service listens on (env "+env+")")
	if err := fs.Parse(args); err != nil {
		return err
	}
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == "addr" })
	if v := getenv(env); v != "" && !given {
		*addr = v
	}
	return HealthCheck(ctx, *addr, stdout)
}
