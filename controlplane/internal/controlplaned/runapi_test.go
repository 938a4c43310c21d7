package controlplaned

import (
	"net/http"
	"strings"
	"testing"

	"github.com/codemode-go/codemode/internal/runhttp"
)

// TestRunBodyTooLarge checks that the control plane's POST /run refuses a
// body over runhttp.MaxRunBody with 413 and the edge's words, before
// reading it whole.
func TestRunBodyTooLarge(t *testing.T) {
	t.Parallel()
	url := startControlPlane(t)
	body := `{"code":"` + strings.Repeat("x", runhttp.MaxRunBody) + `","language":"python"}`
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/run", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if b := readAll(res); res.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(b, "request body larger than") {
		t.Fatalf("HTTP %d %s, want 413 saying the body is too large", res.StatusCode, b)
	}
}
