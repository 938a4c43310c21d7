package cpuset

import (
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestParse(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		list string
		want []int
	}{
		{"0", []int{0}},
		{"0-2,5", []int{0, 1, 2, 5}},
		{"5,0-1", []int{0, 1, 5}},
		{"1,1", []int{1}},
	} {
		if got, err := Parse(c.list); err != nil || !slices.Equal(got, c.want) {
			t.Errorf("Parse(%q) = %v, %v; want %v", c.list, got, err, c.want)
		}
		if got, _ := Parse(List(c.want)); !slices.Equal(got, c.want) {
			t.Errorf("Parse(List(%v)) = %v", c.want, got)
		}
	}
	for _, bad := range []string{"", "a", "1-", "-1", "3-1", "0,,1", "1 "} {
		if got, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) = %v, want an error", bad, got)
		}
	}
}

// TestSpeed measures each CPU this process may use, and checks that the
// thread that measured has its CPUs back.
func TestSpeed(t *testing.T) {
	cpus, err := Host()
	if err != nil {
		t.Fatal(err)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for _, c := range cpus {
		d, err := Speed([]int{c})
		if err != nil {
			t.Fatal(err)
		}
		if d <= 0 || d > time.Second {
			t.Fatalf("Speed(CPU %d) = %v, want about a millisecond", c, d)
		}
	}
	if all, err := Speed(cpus); err != nil || all <= 0 {
		t.Errorf("Speed(%v) = %v, %v", cpus, all, err)
	}
	if _, err := Speed(nil); err == nil {
		t.Error("Speed(nil): no error")
	}
	var after unix.CPUSet
	if err := unix.SchedGetaffinity(0, &after); err != nil {
		t.Fatal(err)
	}
	if after.Count() != len(cpus) {
		t.Errorf("after Speed, the thread may use %d CPUs, want %d", after.Count(), len(cpus))
	}
}

// Pools of one process measure at once (under -race, a shared write
// shows).
func TestSpeedConcurrent(t *testing.T) {
	cpus, err := Host()
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			if _, err := Speed(cpus); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
}
