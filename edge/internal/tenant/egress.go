package tenant

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"

	"buf.build/go/protovalidate"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"github.com/codemode-go/codemode/internal/egressrule"
)

// EgressConfig is what each tenant's runs may reach outside their sandboxes
// (see codemode.execution.v1.Egress), read once from a JSON file:
//
//	{
//	  "default": {"allow": [{"host": "github.api.codemode"}]},
//	  "tenants": {
//	    "team-a": {"allow": [{"host": "api.github.com"}, {"host": "*.githubusercontent.com", "ports": [443]}],
//	               "limits": {"connections": 16, "bytes": "67108864", "connectionTime": "60s"}}
//	  }
//	}
//
// A tenant not listed gets "default"; with no file, or no "default", runs
// reach nothing. Policies may narrow a tenant's egress, never widen it. An
// EgressConfig is immutable and safe for concurrent use.
type EgressConfig struct {
	def     *executionv1.Egress
	tenants map[string]*executionv1.Egress
}

// LoadEgress reads the egress configuration at path; an empty path means
// none (every run reaches nothing).
func LoadEgress(path string) (*EgressConfig, error) {
	if path == "" {
		return &EgressConfig{}, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read egress config: %w", err)
	}
	c, err := ParseEgress(b)
	if err != nil {
		return nil, fmt.Errorf("egress config %s: %w", path, err)
	}
	return c, nil
}

// ParseEgress parses an egress configuration (see [EgressConfig]).
func ParseEgress(b []byte) (*EgressConfig, error) {
	var raw struct {
		Default json.RawMessage            `json:"default"`
		Tenants map[string]json.RawMessage `json:"tenants"`
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(&raw); err != nil {
		return nil, err
	}
	c := &EgressConfig{tenants: make(map[string]*executionv1.Egress, len(raw.Tenants))}
	parse := func(what string, j json.RawMessage) (*executionv1.Egress, error) {
		e := new(executionv1.Egress)
		if err := protojson.Unmarshal(j, e); err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		if err := protovalidate.Validate(e); err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		if err := egressrule.ValidateEgress(e); err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		return e, nil
	}
	var err error
	if len(raw.Default) > 0 {
		if c.def, err = parse("default", raw.Default); err != nil {
			return nil, err
		}
	}
	for t, j := range raw.Tenants {
		if !namePattern.MatchString(t) {
			return nil, fmt.Errorf("tenant name %q: want %s", t, namePattern)
		}
		if c.tenants[t], err = parse("tenant "+t, j); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// For returns tenant's egress (a copy the caller may change); nil: none.
func (c *EgressConfig) For(tenant string) *executionv1.Egress {
	if c == nil {
		return nil
	}
	e, ok := c.tenants[tenant]
	if !ok {
		e = c.def
	}
	if e == nil {
		return nil
	}
	return proto.CloneOf(e)
}

// All returns every egress the configuration gives: the default's and
// each listed tenant's (copies the caller may change), none when nothing
// is configured. What a deployment's runs may reach at most is their
// union.
func (c *EgressConfig) All() []*executionv1.Egress {
	if c == nil {
		return nil
	}
	var out []*executionv1.Egress
	if c.def != nil {
		out = append(out, proto.CloneOf(c.def))
	}
	for _, e := range c.tenants {
		out = append(out, proto.CloneOf(e))
	}
	return out
}
