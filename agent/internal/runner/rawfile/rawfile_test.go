package rawfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

func TestRead(t *testing.T) {
	var buf [1024]byte
	b, err := Read("/proc/self/stat", buf[:])
	if err != nil {
		t.Fatal(err)
	}
	if want := strconv.Itoa(os.Getpid()) + " ("; !strings.HasPrefix(string(b), want) {
		t.Errorf("Read(/proc/self/stat) = %q, want it to begin %q", b, want)
	}

	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, []byte("0123456789"), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, err := Read(path, buf[:4]); err != nil || string(b) != "0123" {
		t.Errorf("Read into 4 bytes = %q, %v; want %q", b, err, "0123")
	}
	if b, err := Read(path, buf[:]); err != nil || string(b) != "0123456789" {
		t.Errorf("Read = %q, %v; want the whole file", b, err)
	}

	_, err = Read(filepath.Join(t.TempDir(), "missing"), buf[:])
	var pe *fs.PathError
	if !errors.Is(err, fs.ErrNotExist) || !errors.As(err, &pe) || pe.Op != "open" {
		t.Errorf("Read of a missing file: %v, want a *fs.PathError of open that is fs.ErrNotExist", err)
	}
	if _, err := Read(t.TempDir(), buf[:]); !errors.Is(err, syscall.EISDIR) {
		t.Errorf("Read of a directory: %v, want EISDIR", err)
	}
}

func TestPread(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, []byte("4096\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var buf [32]byte
	for i := range 2 { // from the start each time, whatever was read before
		b, err := Pread(int(f.Fd()), buf[:])
		if err != nil || string(b) != "4096\n" {
			t.Fatalf("Pread %d = %q, %v", i, b, err)
		}
		if _, err := f.Read(buf[:3]); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Pread(-1, buf[:]); !errors.Is(err, syscall.EBADF) {
		t.Errorf("Pread(-1): %v, want EBADF", err)
	}
}

func TestNames(t *testing.T) {
	dir := t.TempDir()
	if names, err := Names(dir); err != nil || len(names) != 0 {
		t.Errorf("Names of an empty directory = %q, %v; want none", names, err)
	}
	// More entries than one read of the directory returns.
	var want []string
	for i := range 300 {
		n := fmt.Sprintf("%03d-%s", i, strings.Repeat("x", 60))
		want = append(want, n)
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	want = append(want, "sub")
	got, err := Names(dir)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("Names = %d names, want %d (no . or ..): first differences %q", len(got), len(want), firstDiff(got, want))
	}

	if _, err := Names(filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Names of a missing directory: %v, want fs.ErrNotExist", err)
	}
	if _, err := Names(filepath.Join(dir, want[0])); !errors.Is(err, syscall.ENOTDIR) {
		t.Errorf("Names of a file: %v, want ENOTDIR", err)
	}
}

func firstDiff(a, b []string) []string {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return []string{a[i], b[i]}
		}
	}
	return nil
}
