package policytool

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
)

// writeJSON writes v to path as JSON.
func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", path, err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// parseLabels reads --labels: KEY=V1|V2,KEY2 (a key alone: any value).
func parseLabels(s string) (map[string][]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	labels := make(map[string][]string)
	for _, kv := range strings.Split(s, ",") {
		k, vs, _ := strings.Cut(strings.TrimSpace(kv), "=")
		if k == "" {
			return nil, fmt.Errorf("--labels: empty key in %q", s)
		}
		labels[k] = nil
		if vs != "" {
			labels[k] = strings.Split(vs, "|")
		}
	}
	return labels, nil
}
