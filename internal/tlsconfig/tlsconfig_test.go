package tlsconfig

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A certificate replaced before its key is not served with the old key:
// the pair in use stays until both files load together, then the new one
// is served.
func TestKeyPairReload(t *testing.T) {
	ca, err := NewCA("test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	issue := func() *Issued {
		is, err := ca.Issue([]string{"127.0.0.1", "localhost"}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return is
	}
	a := issue()
	certFile, keyFile, err := a.WriteFiles(dir, "svc")
	if err != nil {
		t.Fatal(err)
	}
	k, err := LoadKeyPair(certFile, keyFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	serialA := k.Certificate().Leaf.SerialNumber
	look := func() string {
		k.mu.Lock()
		k.checked = time.Time{} // as if ReloadCheck had passed
		k.mu.Unlock()
		return k.Certificate().Leaf.SerialNumber.String()
	}
	b := issue()
	if err := writeAtomic(certFile, b.CertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := look(); got != serialA.String() {
		t.Fatalf("certificate replaced without its key: serving %s, want the old %s", got, serialA)
	}
	if err := writeAtomic(keyFile, b.KeyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	got := look()
	if got == serialA.String() {
		t.Fatal("both files replaced: still serving the old certificate")
	}
	if _, err := tls.X509KeyPair(b.CertPEM, b.KeyPEM); err != nil {
		t.Fatal(err)
	}
	// Within ReloadCheck the files are not looked at.
	c := issue()
	if _, _, err := c.WriteFiles(dir, "svc"); err != nil {
		t.Fatal(err)
	}
	if now := k.Certificate().Leaf.SerialNumber.String(); now != got {
		t.Errorf("looked at the files again within ReloadCheck")
	}
	if fi, err := os.Stat(filepath.Join(dir, "svc.key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("key file mode: %v %v, want 0600", fi.Mode(), err)
	}
}

func TestLoadKeyPairRefuses(t *testing.T) {
	dir := t.TempDir()
	if _, err := LoadKeyPair(filepath.Join(dir, "none.crt"), filepath.Join(dir, "none.key"), nil); err == nil {
		t.Error("missing files loaded")
	}
	if _, err := LoadKeyPair("", "", nil); err == nil {
		t.Error("no files loaded")
	}
}
