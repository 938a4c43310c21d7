package secretfile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRead(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, tt := range []struct {
		name string
		mode os.FileMode
		ok   bool
	}{
		{"owner only", 0o600, true},
		{"owner read only", 0o400, true},
		{"owner executable", 0o700, true},
		{"group reads", 0o640, false},
		{"others read", 0o604, false},
		{"world readable", 0o644, false},
		{"group writes", 0o620, false},
		{"others write", 0o602, false},
		{"everyone", 0o666, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(dir, strings.ReplaceAll(tt.name, " ", "-"))
			if err := os.WriteFile(path, []byte("s3cr3t\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(path, tt.mode); err != nil { // past the umask
				t.Fatal(err)
			}
			b, err := Read(path)
			if tt.ok {
				if err != nil || string(b) != "s3cr3t\n" {
					t.Fatalf("Read: %q %v, want the contents", b, err)
				}
				return
			}
			if !errors.Is(err, ErrExposed) {
				t.Fatalf("Read: %q %v, want ErrExposed", b, err)
			}
			if !strings.Contains(err.Error(), "chmod 600 "+path) || strings.Contains(err.Error(), "s3cr3t") {
				t.Errorf("error %q: want the fix (chmod 600 %s), and never the contents", err, path)
			}
		})
	}
	if _, err := Read(filepath.Join(dir, "none")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a missing file: %v, want ErrNotExist", err)
	}
}
