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

// mplBackendModule is the module name of mplbackend.py in the Python lib
// directory; MPLBACKEND names it.
const mplBackendModule = "codemode_mpl"

// preparePythonLib makes cfg.pythonLib root's and not writable by the user,
// and writes the modules the runner lends user code into it. It returns the
// environment that puts them to use, or nil when the directory is not there
// (a sandbox without it runs Python without them).
func preparePythonLib(cfg config) ([]string, error) {
	dir := cfg.pythonLib
	if dir == "" {
		return nil, nil
	}
	fi, err := os.Lstat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("python lib: %w", err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("python lib %s is not a directory", dir)
	}
	if os.Geteuid() == 0 {
		if err := os.Chown(dir, 0, 0); err != nil {
			return nil, fmt.Errorf("python lib: %w", err)
		}
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, fmt.Errorf("python lib: %w", err)
	}
	outputs := filepath.Join(cfg.workspace, wire.OutputsDir)
	src := strings.Replace(mplBackendSource, "{{OUTPUTS}}", strconv.Quote(outputs), 1)
	if err := os.WriteFile(filepath.Join(dir, mplBackendModule+".py"), []byte(src), 0o644); err != nil {
		return nil, fmt.Errorf("python lib: %w", err)
	}
	return []string{"PYTHONPATH=" + dir, "MPLBACKEND=module://" + mplBackendModule}, nil
}
