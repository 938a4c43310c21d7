// Package cli holds what the codemode binaries share at start-up: flags that
// also read environment variables, the slog logger, and signal handling.
package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/codemode-go/codemode/internal/version"
	"go.opentelemetry.io/otel/trace"
)

// Flags is a flag set whose flags may each also be set by an environment
// variable. A flag given on the command line wins over its variable.
type Flags struct {
	*flag.FlagSet
	env map[string]string // flag name -> variable
}

// NewFlags returns an empty flag set for the program name that writes usage
// and errors to w.
func NewFlags(name string, w io.Writer) *Flags {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(w)
	return &Flags{FlagSet: fs, env: map[string]string{}}
}

// Env ties the already defined flag name to the environment variable env and
// notes the variable in the flag's usage.
func (f *Flags) Env(name, env string) {
	fl := f.Lookup(name)
	if fl == nil {
		panic("cli: no flag " + name)
	}
	f.env[name] = env
	fl.Usage += " (env " + env + ")"
}

// Parse parses args, then applies environment variables (read with getenv)
// to the flags not given on the command line.
func (f *Flags) Parse(args []string, getenv func(string) string) error {
	if err := f.FlagSet.Parse(args); err != nil {
		return err
	}
	if f.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", f.Args())
	}
	given := map[string]bool{}
	f.Visit(func(fl *flag.Flag) { given[fl.Name] = true })
	for name, env := range f.env {
		if given[name] {
			continue
		}
		if v := getenv(env); v != "" {
			if err := f.Set(name, v); err != nil {
				return fmt.Errorf("%s=%q: %w", env, v, err)
			}
		}
	}
	return nil
}

// LogFlags defines --log-format and --log-level on f.
func LogFlags(f *Flags) (format, level *string) {
	format = f.String("log-format", "text", "log format: text or json")
	level = f.String("log-level", "info", "log level: debug, info, warn or error")
	f.Env("log-format", "LOG_FORMAT")
	f.Env("log-level", "LOG_LEVEL")
	return format, level
}

// NewLogger returns a logger writing to w in format ("text" or "json") at
// level ("debug", "info", "warn", "error").
func NewLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: %w", level, err)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch strings.ToLower(format) {
	case "text", "":
		return slog.New(traceHandler{slog.NewTextHandler(w, opts)}), nil
	case "json":
		return slog.New(traceHandler{slog.NewJSONHandler(w, opts)}), nil
	default:
		return nil, fmt.Errorf("log format %q: want text or json", format)
	}
}

// traceHandler adds trace_id and span_id to a line logged with a context
// that carries a span (slog's Context methods and LogAttrs), so that a log
// line leads to its trace.
type traceHandler struct{ slog.Handler }

func (h traceHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return h.Handler.Handle(ctx, r)
}

func (h traceHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return traceHandler{h.Handler.WithAttrs(as)}
}

func (h traceHandler) WithGroup(name string) slog.Handler {
	return traceHandler{h.Handler.WithGroup(name)}
}

// SignalContext returns a context that is done on SIGINT or SIGTERM.
func SignalContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
}

// Main runs a binary's Run function with the process's arguments, standard
// streams and environment, and exits non-zero if it fails. `--version` (or
// `-version`, `version`) as the only argument prints the build's version
// instead (see package version).
func Main(run func(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error) {
	if len(os.Args) == 2 && (os.Args[1] == "--version" || os.Args[1] == "-version" || os.Args[1] == "version") {
		fmt.Println(version.String(filepath.Base(os.Args[0])))
		return
	}
	ctx, stop := SignalContext(context.Background())
	err := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if err == flag.ErrHelp {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
