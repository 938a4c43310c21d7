package policy

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"path/filepath"
	"regexp"
	"time"

	"github.com/codemode-go/codemode/internal/limits"
)

// Config is the policy configuration file, in JSON. Durations are strings
// in Go's syntax ("20ms"). Unknown fields are an error.
//
//	{
//	  "labels": {"pool": ["python", "node"]},
//	  "policies": [
//	    {"name": "languages", "path": "languages.wasm", "sha256": "9f86d0...",
//	     "phase": "request", "order": 10, "config": "*: python"}
//	  ]
//	}
type Config struct {
	// Fuel and FuelPerInputByte are the default budget of one policy call,
	// in units of work: a unit is one loop iteration or one function call
	// in the guest, and a call gets Fuel plus FuelPerInputByte for every
	// byte of its input. A call that needs more fails with "fuel
	// exhausted". Fuel is what bounds a call: unlike a wall-clock deadline
	// it does not run out while the call waits for a CPU. Defaults
	// 10,000,000 (about 10 ms of a guest's empty loop) and 64; the examples
	// use at most a twentieth of that (RATIONALE.md).
	Fuel             uint64 `json:"fuel,omitempty"`
	FuelPerInputByte uint64 `json:"fuel_per_input_byte,omitempty"`
	// Deadline is the default wall-clock backstop of one policy call, for
	// what fuel does not count: a call blocked in a host function, and
	// modules that cannot be instrumented (which have no fuel). It is long
	// so that a call waiting for a CPU on an overloaded host is not cut
	// short (a 1s backstop was passed at load average 17 on two cores).
	// Default 10s.
	Deadline Duration `json:"deadline,omitempty"`
	// DefaultTimeout is the run timeout assumed for a request that sets
	// none; a policy's timeout counts as tighter only if it is below the
	// request's timeout or, when unset, this. The edge fills in the agents'
	// default timeout before policies run, so this counts only while no
	// agent has reported one. Default 30s.
	DefaultTimeout Duration `json:"default_timeout,omitempty"`
	// Labels are the agent labels policies may route to: each key with its
	// allowed values, or with an empty list for any value. A route to a key
	// not listed, or to a value not listed, makes the decision invalid.
	Labels map[string][]string `json:"labels,omitempty"`
	// Policies are the modules to load, in any order.
	Policies []PolicyConfig `json:"policies"`
}

// PolicyConfig is one module of the configuration.
type PolicyConfig struct {
	// Name identifies the policy in denials, logs and the admin service.
	Name string `json:"name"`
	// Path of the .wasm file, relative to the configuration file's directory.
	Path string `json:"path"`
	// SHA256 is the hex sha256 of the module. A file with another digest is
	// not loaded.
	SHA256 string `json:"sha256"`
	// Phase is "request" or "result".
	Phase string `json:"phase"`
	// Order places the policy in its phase's chain: lower runs first; ties
	// keep the file's order.
	Order int `json:"order,omitempty"`
	// FailureMode is "closed" (default: a failing policy denies the request
	// with reason "policy_unavailable") or "open" (a failing policy is
	// skipped; for advisory policies only).
	FailureMode string `json:"failure_mode,omitempty"`
	// Config is passed to the module's init export, as UTF-8 bytes.
	Config string `json:"config,omitempty"`
	// ConfigBase64 is passed instead of Config when the bytes are binary.
	ConfigBase64 string `json:"config_base64,omitempty"`
	// PoolSize is the number of warm instances, the calls it can run at
	// once. Default: GOMAXPROCS, at most 8.
	PoolSize int `json:"pool_size,omitempty"`
	// Fuel and FuelPerInputByte override the file's for this policy.
	Fuel             uint64 `json:"fuel,omitempty"`
	FuelPerInputByte uint64 `json:"fuel_per_input_byte,omitempty"`
	// Deadline overrides the file's Deadline for this policy.
	Deadline Duration `json:"deadline,omitempty"`
	// MemoryLimitPages caps each instance's memory in 64 KiB pages.
	// Default 512 (32 MiB).
	MemoryLimitPages uint32 `json:"memory_limit_pages,omitempty"`
	// MaxInputBytes is the largest input written to the module; a bigger
	// one counts as a failure of the policy. Default 8 MiB.
	MaxInputBytes int `json:"max_input_bytes,omitempty"`
}

// Duration is a time.Duration that reads and writes Go's duration syntax.
type Duration time.Duration

// UnmarshalJSON implements json.Unmarshaler.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration must be a string like \"20ms\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// MarshalJSON implements json.Marshaler.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// Defaults.
const (
	DefaultFuel             = 10_000_000
	DefaultFuelPerInputByte = 64
	DefaultDeadline         = 10 * time.Second
	DefaultRunTimeout       = limits.DefaultTimeout
	DefaultMemoryLimitPages = 512
	DefaultMaxInputBytes    = 8 << 20
	maxPoolSize             = 64
)

// Phases and failure modes.
const (
	PhaseRequest = "request"
	PhaseResult  = "result"
	FailClosed   = "closed"
	FailOpen     = "open"
)

var (
	nameRE  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$`)
	labelRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9_.-]*[a-z0-9])?$`)
)

// ParseConfig decodes and validates a configuration file's bytes.
func ParseConfig(b []byte) (*Config, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var c Config
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("decode policy config: %w", err)
	}
	if dec.More() {
		return nil, errors.New("decode policy config: trailing data")
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// Validate checks the configuration and fills in defaults.
func (c *Config) Validate() error {
	if c.Deadline < 0 || c.DefaultTimeout < 0 {
		return errors.New("policy config: negative duration")
	}
	if c.Deadline == 0 {
		c.Deadline = Duration(DefaultDeadline)
	}
	if c.Fuel == 0 {
		c.Fuel = DefaultFuel
	}
	if c.FuelPerInputByte == 0 {
		c.FuelPerInputByte = DefaultFuelPerInputByte
	}
	if c.DefaultTimeout == 0 {
		c.DefaultTimeout = Duration(DefaultRunTimeout)
	}
	for k, vs := range c.Labels {
		if len(k) > 63 || !labelRE.MatchString(k) {
			return fmt.Errorf("policy config: bad label key %q", k)
		}
		for _, v := range vs {
			if len(v) > 63 {
				return fmt.Errorf("policy config: label %s: value too long", k)
			}
		}
	}
	seen := make(map[string]bool)
	var errs []error
	for i := range c.Policies {
		p := &c.Policies[i]
		if err := p.validate(c); err != nil {
			errs = append(errs, fmt.Errorf("policy %d (%s): %w", i, p.Name, err))
			continue
		}
		if seen[p.Name] {
			errs = append(errs, fmt.Errorf("policy %d: duplicate name %q", i, p.Name))
		}
		seen[p.Name] = true
	}
	if len(errs) > 0 {
		return fmt.Errorf("policy config: %w", errors.Join(errs...))
	}
	return nil
}

func (p *PolicyConfig) validate(c *Config) error {
	if !nameRE.MatchString(p.Name) {
		return errors.New("name must match " + nameRE.String())
	}
	if p.Path == "" {
		return errors.New("path is required")
	}
	if d, err := hex.DecodeString(p.SHA256); err != nil || len(d) != 32 {
		return errors.New("sha256 must be 64 hex digits")
	}
	switch p.Phase {
	case PhaseRequest, PhaseResult:
	default:
		return fmt.Errorf("phase must be %q or %q", PhaseRequest, PhaseResult)
	}
	switch p.FailureMode {
	case "":
		p.FailureMode = FailClosed
	case FailClosed, FailOpen:
	default:
		return fmt.Errorf("failure_mode must be %q or %q", FailClosed, FailOpen)
	}
	if p.Config != "" && p.ConfigBase64 != "" {
		return errors.New("set config or config_base64, not both")
	}
	if p.ConfigBase64 != "" {
		if _, err := base64.StdEncoding.DecodeString(p.ConfigBase64); err != nil {
			return fmt.Errorf("config_base64: %w", err)
		}
	}
	if p.PoolSize < 0 || p.PoolSize > maxPoolSize {
		return fmt.Errorf("pool_size must be 0..%d", maxPoolSize)
	}
	if p.Deadline < 0 || p.MaxInputBytes < 0 {
		return errors.New("negative deadline or max_input_bytes")
	}
	if p.Deadline == 0 {
		p.Deadline = c.Deadline
	}
	if p.Fuel == 0 {
		p.Fuel = c.Fuel
	}
	if p.FuelPerInputByte == 0 {
		p.FuelPerInputByte = c.FuelPerInputByte
	}
	if p.MemoryLimitPages == 0 {
		p.MemoryLimitPages = DefaultMemoryLimitPages
	}
	if p.MemoryLimitPages > 65536 {
		return errors.New("memory_limit_pages must be at most 65536")
	}
	if p.MaxInputBytes == 0 {
		p.MaxInputBytes = DefaultMaxInputBytes
	}
	return nil
}

// fuel returns the budget of a call with an input of n bytes: Fuel plus
// FuelPerInputByte per byte, at most math.MaxInt64 (the guest's counter is
// a signed i64).
func (p *PolicyConfig) fuel(n int) uint64 {
	hi, lo := bits.Mul64(p.FuelPerInputByte, uint64(n))
	sum, carry := bits.Add64(lo, p.Fuel, 0)
	if hi != 0 || carry != 0 || sum > math.MaxInt64 {
		return math.MaxInt64
	}
	return sum
}

// configBytes returns the bytes given to the module's init export.
func (p *PolicyConfig) configBytes() []byte {
	if p.ConfigBase64 != "" {
		b, _ := base64.StdEncoding.DecodeString(p.ConfigBase64) // checked by validate
		return b
	}
	return []byte(p.Config)
}

// resolve returns the module's path relative to dir.
func (p *PolicyConfig) resolve(dir string) string {
	if filepath.IsAbs(p.Path) {
		return p.Path
	}
	return filepath.Join(dir, p.Path)
}
