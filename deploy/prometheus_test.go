package deploy

import (
	"os/exec"
	"testing"
)

// The example scrape configuration and alerting rules pass promtool
// (Debian's prometheus package, which agent/host/setup.sh installs). That
// every metric they name exists is TestMetrics' (edge/e2e), which scrapes
// the three services.
func TestPrometheusConfig(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool is not installed: agent/host/setup.sh installs it (package prometheus): %v", err)
	}
	for _, args := range [][]string{
		{"check", "config", "prometheus/prometheus.yml"},
		{"check", "rules", "prometheus/alerts.yml"},
	} {
		if out, err := exec.Command(promtool, args...).CombinedOutput(); err != nil {
			t.Errorf("promtool %v: %v\n%s", args, err, out)
		}
	}
}
