package agentd

import (
	"io"
	"maps"
	"strings"
	"testing"
	"time"
)

func TestParseConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		check   func(t *testing.T, c Config)
		wantErr string
	}{
		{name: "defaults", check: func(t *testing.T, c Config) {
			if c.Addr != ":30031" || c.Image != "codemode-sandbox:bookworm" || c.MinActive != 2 || c.Runtime != "runsc" {
				t.Errorf("defaults: %+v", c)
			}
		}},
		{name: "seed variables", env: map[string]string{"WORKER_PORT": "30099", "DOCKER_IMAGE_NAME": "python:3.14-slim", "MIN_ACTIVE": "3"}, check: func(t *testing.T, c Config) {
			if c.Addr != ":30099" || c.Image != "python:3.14-slim" || c.MinActive != 3 {
				t.Errorf("from env: %+v", c)
			}
		}},
		{name: "worker port as host:port", env: map[string]string{"WORKER_PORT": "127.0.0.1:4000"}, check: func(t *testing.T, c Config) {
			if c.Addr != "127.0.0.1:4000" {
				t.Errorf("addr %q", c.Addr)
			}
		}},
		{name: "flag wins over env", args: []string{"--addr", ":1234"}, env: map[string]string{"WORKER_PORT": "30099"}, check: func(t *testing.T, c Config) {
			if c.Addr != ":1234" {
				t.Errorf("addr %q", c.Addr)
			}
		}},
		{name: "sizes, labels and durations", args: []string{"--memory", "256m", "--max-output", "2MiB", "--labels", "zone=a, gpu=no", "--session-idle-ttl", "90s", "--name", "w1"}, check: func(t *testing.T, c Config) {
			if c.Memory != 256<<20 || c.MaxOutput != 2<<20 || !maps.Equal(c.Labels, map[string]string{"zone": "a", "gpu": "no"}) || c.SessionIdleTTL != 90*time.Second || c.Name != "w1" {
				t.Errorf("parsed: %+v", c)
			}
		}},
		{name: "sessions per tenant", env: map[string]string{"MAX_SESSIONS_PER_TENANT": "2"}, check: func(t *testing.T, c Config) {
			if c.MaxSessionsPerTenant != 2 || DefaultConfig().MaxSessionsPerTenant >= DefaultConfig().MaxSessions {
				t.Errorf("max sessions per tenant %d (default %d of %d)", c.MaxSessionsPerTenant, DefaultConfig().MaxSessionsPerTenant, DefaultConfig().MaxSessions)
			}
		}},
		{name: "no session per tenant", args: []string{"--max-sessions-per-tenant", "0"}, wantErr: "max-sessions-per-tenant"},
		{name: "min above max", args: []string{"--min-active", "9", "--max-sandboxes", "4"}, wantErr: "min-active"},
		{name: "bad size", args: []string{"--memory", "lots"}, wantErr: "size"},
		{name: "memory above maximum", args: []string{"--memory", "4g", "--max-memory", "1g"}, wantErr: "memory"},
		{name: "bad label", args: []string{"--labels", "novalue"}, wantErr: "key=value"},
		{name: "pids too low for runsc", args: []string{"--pids-limit", "32"}, wantErr: "pids-limit"},
		{name: "stray argument", args: []string{"extra"}, wantErr: "unexpected"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, err := ParseConfig(tt.args, func(k string) string { return tt.env[k] }, io.Discard)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one mentioning %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, c)
		})
	}
}

func TestParseBytes(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]int64{"0": 0, "512": 512, "64k": 64 << 10, "64m": 64 << 20, "64MiB": 64 << 20, "2g": 2 << 30, "1GB": 1 << 30} {
		if got, err := parseBytes(in); err != nil || got != want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "-1", "m", "1.5g", "1t"} {
		if _, err := parseBytes(in); err == nil {
			t.Errorf("parseBytes(%q) succeeded", in)
		}
	}
}

func TestCheckRunner(t *testing.T) {
	t.Parallel()
	if err := checkRunner("/bin/ls"); err == nil || !strings.Contains(err.Error(), "dynamically linked") {
		t.Errorf("dynamic binary: %v", err)
	}
	if err := checkRunner(t.TempDir() + "/missing"); err == nil || !strings.Contains(err.Error(), "CGO_ENABLED=0") {
		t.Errorf("missing binary: %v", err)
	}
}

// TestConfigCeilings checks that no configuration allows runs more than a
// request may carry (the protos' rules, package limits' ceilings), and that
// the ceilings themselves are allowed.
func TestConfigCeilings(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		flag, over, at string
	}{
		{"max-timeout", "25h", "24h"},
		{"max-output", "65m", "64m"},
		{"max-memory", "5g", "4g"},
		{"max-session-idle-ttl", "25h", "24h"},
	} {
		t.Run(tc.flag, func(t *testing.T) {
			t.Parallel()
			getenv := func(string) string { return "" }
			if _, err := ParseConfig([]string{"--" + tc.flag, tc.over}, getenv, io.Discard); err == nil || !strings.Contains(err.Error(), tc.flag) {
				t.Errorf("--%s=%s: %v, want an error naming the flag", tc.flag, tc.over, err)
			}
			if _, err := ParseConfig([]string{"--" + tc.flag, tc.at}, getenv, io.Discard); err != nil {
				t.Errorf("--%s=%s: %v", tc.flag, tc.at, err)
			}
		})
	}
}
