package server

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// NewClient returns an HTTP client that speaks HTTP/2, as gRPC between
// codemode's services needs: without TLS (h2c) to plain http:// addresses,
// over TLS to https:// ones (give its transport a TLSClientConfig that
// trusts the peer's CA; see cluster.Links). It keeps connections open and
// is safe for concurrent use.
//
// A connection silent for 10 s is pinged, and given up 5 s after an
// unanswered ping: a call in flight to a peer whose link went down then
// fails within 15 s instead of hanging. A peer that computes silently
// answers pings all the while.
func NewClient() *http.Client {
	var protocols http.Protocols
	protocols.SetUnencryptedHTTP2(true)
	protocols.SetHTTP2(true)
	return &http.Client{
		Transport: &http.Transport{
			Protocols: &protocols,
			DialContext: (&net.Dialer{
				Timeout:   5 * time.Second,
				KeepAlive: 30 * time.Second,
			}).DialContext,
			ForceAttemptHTTP2: true,
			TLSClientConfig:   &tls.Config{MinVersion: tls.VersionTLS12},
			HTTP2: &http.HTTP2Config{
				PingTimeout:     5 * time.Second,
				SendPingTimeout: 10 * time.Second,
			},
		},
	}
}

// Listen opens a TCP listener on addr, honouring ctx while it binds.
func Listen(ctx context.Context, addr string) (net.Listener, error) {
	var lc net.ListenConfig
	return lc.Listen(ctx, "tcp", addr)
}

// NewEdgeClient returns a client of the edge at edgeURL (http:// or
// https://, a host and maybe a port) as a program outside the cluster calls
// it, and the URL without a trailing slash: h2c to an http:// edge, as
// between codemode's services; HTTP/1.1 or HTTP/2 over TLS to an https://
// one.
func NewEdgeClient(edgeURL string) (*http.Client, string, error) {
	u, err := url.Parse(edgeURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, "", fmt.Errorf("--url %q: want http(s)://host[:port]", edgeURL)
	}
	tr := NewClient().Transport.(*http.Transport).Clone()
	tr.Protocols.SetHTTP1(true)
	tr.Protocols.SetHTTP2(true)
	return &http.Client{Transport: tr}, strings.TrimRight(edgeURL, "/"), nil
}
