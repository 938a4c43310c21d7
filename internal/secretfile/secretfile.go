// Package secretfile reads files that hold secrets: the cluster secret, the
// edge's API keys, an API's credential. It refuses a file that its group or
// other users may read or write, as ssh refuses such a private key: a
// secret others can read is known to them, and one they can write is
// theirs to choose (a key file that names their own key, a cluster secret
// they set before the next restart).
//
// The mode is read from the open file, so the file checked is the file
// read. Read is safe for concurrent use.
package secretfile

import (
	"errors"
	"fmt"
	"io"
	"os"
)

// ErrExposed is the refusal of a file that its group or other users may
// read or write. Errors wrapping it say how to fix the file.
var ErrExposed = errors.New("readable or writable by its group or other users")

// exposed are the permission bits that refuse a file.
const exposed = 0o066

// Read returns the contents of the file at path. A file that its group or
// other users may read or write is refused with an error wrapping
// [ErrExposed] that names the file and the fix (chmod 600 path).
func Read(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if perm := fi.Mode().Perm(); perm&exposed != 0 {
		return nil, fmt.Errorf("%s has mode %04o, %w: make it the service's own with `chmod 600 %s` (a secret mounted by Docker or Kubernetes: give it mode 0400)", path, perm, ErrExposed, path)
	}
	return io.ReadAll(f)
}
