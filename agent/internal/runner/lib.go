package runner

import (
	_ "embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/codemode-go/codemode/agent/internal/wire"
)

//go:embed mplbackend.py
var mplBackendSource string

//go:embed egress.js
var nodeEgressSource []byte

// mplBackendModule is the module name of mplbackend.py in the lib
// directory; MPLBACKEND names it.
const mplBackendModule = "codemode_mpl"

// nodeEgressModule is the file name of egress.js in the lib directory;
// NODE_OPTIONS preloads it (see proxyEnv).
const nodeEgressModule = "codemode_egress.js"

// prepareLib makes cfg.lib root's and not writable by the user, and writes
// the modules the runner lends user code into it. It returns the
// environment that puts the Python ones to use, and matplotlib's directory
// (see mplConfig), and the directory, or nil and "" when the directory is
// not there (a sandbox without it runs user code without them).
func prepareLib(cfg config) (env []string, dir string, err error) {
	dir = cfg.lib
	if dir == "" {
		return nil, "", nil
	}
	fi, err := os.Lstat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("lib: %w", err)
	}
	if !fi.IsDir() {
		return nil, "", fmt.Errorf("lib %s is not a directory", dir)
	}
	if os.Geteuid() == 0 {
		if err := os.Chown(dir, 0, 0); err != nil {
			return nil, "", fmt.Errorf("lib: %w", err)
		}
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, "", fmt.Errorf("lib: %w", err)
	}
	outputs := filepath.Join(cfg.workspace, wire.OutputsDir)
	src := strings.Replace(mplBackendSource, "{{OUTPUTS}}", strconv.Quote(outputs), 1)
	if err := os.WriteFile(filepath.Join(dir, mplBackendModule+".py"), []byte(src), 0o644); err != nil {
		return nil, "", fmt.Errorf("lib: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, nodeEgressModule), nodeEgressSource, 0o644); err != nil {
		return nil, "", fmt.Errorf("lib: %w", err)
	}
	return []string{"PYTHONPATH=" + dir, "MPLBACKEND=module://" + mplBackendModule, "MPLCONFIGDIR=" + mplConfigDir(dir)}, dir, nil
}

// mplConfigDir is matplotlib's directory in lib (see mplConfig).
func mplConfigDir(lib string) string { return filepath.Join(lib, "matplotlib") }

// proxyEnv is the environment that points user code at the proxy on addr.
func proxyEnv(addr string, lib string) []string {
	u := "http://" + addr
	noProxy := "localhost,127.0.0.1,::1"
	env := []string{
		"HTTP_PROXY=" + u, "http_proxy=" + u,
		"HTTPS_PROXY=" + u, "https_proxy=" + u,
		"NO_PROXY=" + noProxy, "no_proxy=" + noProxy,
	}
	if lib != "" {
		// Node's fetch does not read HTTP_PROXY; the preload makes it.
		env = append(env, "NODE_OPTIONS=--require "+lib+"/"+nodeEgressModule)
	}
	return env
}
