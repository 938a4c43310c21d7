package benchbase

import (
	"os"
	"testing"
	"time"
)

func TestParseProcStat(t *testing.T) {
	// A name with a space and a parenthesis, utime 250 and stime 31 ticks.
	line := "4242 (a b) c) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 31 0 0 20 0 7 0 123 4567 89 18446744073709551615\n"
	s, err := ParseProcStat([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	if s.Comm != "a b) c" || s.CPU != 2810*time.Millisecond {
		t.Errorf("got %+v, want comm %q and 2.81s", s, "a b) c")
	}
	for _, bad := range []string{"", "4242 a S 1", "4242 (x) S 1 2 3"} {
		if _, err := ParseProcStat([]byte(bad)); err == nil {
			t.Errorf("ParseProcStat(%q): no error", bad)
		}
	}
}

func TestParseHostCPU(t *testing.T) {
	// user 100, nice 2, system 50, idle 1000, iowait 40, irq 3, softirq 5.
	got, err := parseHostCPU("cpu  100 2 50 1000 40 3 5 7 0 0")
	if err != nil {
		t.Fatal(err)
	}
	if want := 1600 * time.Millisecond; got != want {
		t.Errorf("busy %v, want %v", got, want)
	}
	if _, err := parseHostCPU("cpu0 1 2 3 4 5 6 7"); err == nil {
		t.Error("a per-CPU line: no error")
	}
}

// TestThisProcess reads this process's own CPU time after it burned some,
// and the host's, which cannot be less.
func TestThisProcess(t *testing.T) {
	h0, err := HostCPU()
	if err != nil {
		t.Fatal(err)
	}
	c0, err := ProcessCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// Spin until this process's CPU has grown by 50 ms: on a loaded host
	// 100 ms of spinning can get far less CPU than that, so the spin is
	// bounded by a deadline, not by its own length.
	var c time.Duration
	for deadline := time.Now().Add(20 * time.Second); c-c0 < 50*time.Millisecond; {
		if time.Now().After(deadline) {
			t.Fatalf("this process's CPU grew by %v in 20 s of spinning", c-c0)
		}
		for t1 := time.Now(); time.Since(t1) < 10*time.Millisecond; {
		}
		if c, err = ProcessCPU(os.Getpid()); err != nil {
			t.Fatal(err)
		}
	}
	h1, err := HostCPU()
	if err != nil {
		t.Fatal(err)
	}
	// Both count in clock ticks, read at slightly different moments: allow
	// two ticks.
	if h1-h0 < c-c0-20*time.Millisecond {
		t.Errorf("the host was busy %v while this process used %v", h1-h0, c-c0)
	}
}
