package cli

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/trace"
)

func TestFlagsAndEnvironment(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		args    []string
		env     map[string]string
		want    string
		wantErr bool
	}{
		{"default", nil, nil, ":30031", false},
		{"environment", nil, map[string]string{"WORKER_PORT": ":4000"}, ":4000", false},
		{"flag wins over environment", []string{"--addr", ":5000"}, map[string]string{"WORKER_PORT": ":4000"}, ":5000", false},
		{"stray argument", []string{"extra"}, nil, "", true},
		{"unknown flag", []string{"--nope"}, nil, "", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := NewFlags("agent", io.Discard)
			addr := f.String("addr", ":30031", "listen address")
			f.Env("addr", "WORKER_PORT")
			err := f.Parse(tc.args, func(k string) string { return tc.env[k] })
			if (err != nil) != tc.wantErr {
				t.Fatalf("err %v, wantErr %v", err, tc.wantErr)
			}
			if err == nil && *addr != tc.want {
				t.Fatalf("addr %q, want %q", *addr, tc.want)
			}
		})
	}
}

func TestBadEnvironmentValueIsAnError(t *testing.T) {
	t.Parallel()
	f := NewFlags("agent", io.Discard)
	f.Int("min-active", 2, "warm sandboxes")
	f.Env("min-active", "MIN_ACTIVE")
	if err := f.Parse(nil, func(string) string { return "two" }); err == nil {
		t.Fatal("MIN_ACTIVE=two parsed without error")
	}
}

func TestNewLogger(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		format, level string
		ok            bool
	}{{"text", "info", true}, {"json", "debug", true}, {"xml", "info", false}, {"text", "loud", false}} {
		_, err := NewLogger(io.Discard, tc.format, tc.level)
		if (err == nil) != tc.ok {
			t.Errorf("NewLogger(%q, %q): %v", tc.format, tc.level, err)
		}
	}
}

// A line logged with a context that carries a span names the trace and
// the span; one without names neither.
func TestLogsNameTheirTrace(t *testing.T) {
	var b bytes.Buffer
	log, err := NewLogger(&b, "json", "info")
	if err != nil {
		t.Fatal(err)
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
		SpanID:  trace.SpanID{1, 2, 3, 4, 5, 6, 7, 8}, TraceFlags: trace.FlagsSampled,
	})
	log.With("component", "test").InfoContext(trace.ContextWithSpanContext(context.Background(), sc), "with")
	log.InfoContext(context.Background(), "without")
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("lines: %q", lines)
	}
	if !strings.Contains(lines[0], `"trace_id":"0102030405060708090a0b0c0d0e0f10"`) || !strings.Contains(lines[0], `"span_id":"0102030405060708"`) {
		t.Errorf("line with a span: %s", lines[0])
	}
	if strings.Contains(lines[1], "trace_id") {
		t.Errorf("line without a span: %s", lines[1])
	}
}
