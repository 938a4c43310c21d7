// Command devcerts makes a development CA and certificates its services
// present (`make certs`): DIR/ca.crt and ca.key once (kept on later runs),
// then DIR/NAME.crt and NAME.key for each -cert NAME=HOST,HOST... For
// development and tests only: production brings its own CA, or ACME for
// the edge.
//
//	go run ./internal/tlsconfig/devcerts -dir DIR -cert edge=localhost,127.0.0.1
package main

import (
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"time"

	"github.com/codemode-go/codemode/internal/tlsconfig"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "devcerts:", err)
		os.Exit(1)
	}
}

type certFlags []string

func (c *certFlags) String() string     { return strings.Join(*c, " ") }
func (c *certFlags) Set(v string) error { *c = append(*c, v); return nil }

func run(args []string) error {
	f := flag.NewFlagSet("devcerts", flag.ContinueOnError)
	dir := f.String("dir", "", "directory of the CA and the certificates")
	validity := f.Duration("validity", 90*24*time.Hour, "how long each certificate issued now is valid")
	var certs certFlags
	f.Var(&certs, "cert", "NAME=HOST[,HOST...]: issue NAME.crt and NAME.key for those host names and addresses (repeatable)")
	if err := f.Parse(args); err != nil {
		return err
	}
	if *dir == "" {
		return errors.New("want -dir")
	}
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		return err
	}
	ca, err := tlsconfig.LoadCA(*dir)
	if errors.Is(err, fs.ErrNotExist) {
		if ca, err = tlsconfig.NewCA("codemode development CA", 10*365*24*time.Hour); err == nil {
			err = ca.WriteFiles(*dir)
			fmt.Printf("devcerts: new CA %s/ca.crt\n", *dir)
		}
	}
	if err != nil {
		return err
	}
	for _, c := range certs {
		name, hosts, ok := strings.Cut(c, "=")
		if !ok || name == "" || hosts == "" || strings.ContainsAny(name, "/.") {
			return fmt.Errorf("-cert %q: want NAME=HOST[,HOST...]", c)
		}
		is, err := ca.Issue(strings.Split(hosts, ","), *validity)
		if err != nil {
			return err
		}
		cert, key, err := is.WriteFiles(*dir, name)
		if err != nil {
			return err
		}
		fmt.Printf("devcerts: %s and %s for %s\n", cert, key, hosts)
	}
	return nil
}
