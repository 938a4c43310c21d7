package redistest

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

// TestServerWantsItsPassword: the server refuses a client without the
// password, takes one with it, and its command line does not show it.
func TestServerWantsItsPassword(t *testing.T) {
	t.Parallel()
	s := Start(t)
	if err := ping(t.Context(), (&net.Dialer{}).DialContext, s.Addr, s.Password, nil); err != nil {
		t.Fatalf("with the password: %v", err)
	}
	c, err := net.Dial("tcp", s.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || !strings.HasPrefix(line, "-NOAUTH") {
		t.Errorf("PING without the password: %q %v, want -NOAUTH", line, err)
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", s.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Password) < 32 || bytes.Contains(cmdline, []byte(s.Password)) {
		t.Errorf("password of %d characters, command line %q: want a long password, not on it", len(s.Password), cmdline)
	}
	if !strings.Contains(s.URL, ":"+s.Password+"@") {
		t.Errorf("URL %q does not carry the password", s.URL)
	}
}
