package cpuslots

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/codemode-go/codemode/internal/testkit"
)

// enterAsync enters g in a goroutine and returns a channel that yields the
// ticket once admitted.
func enterAsync(t *testing.T, ctx context.Context, g *Gate) <-chan *Ticket {
	t.Helper()
	ch := make(chan *Ticket, 1)
	go func() {
		tk, err := g.Enter(ctx)
		if err != nil {
			t.Errorf("Enter: %v", err)
		}
		ch <- tk
	}()
	return ch
}

// waitWaiting waits until n callers wait at g.
func waitWaiting(t *testing.T, g *Gate, n int) {
	t.Helper()
	testkit.Eventually(t, 5*time.Second, func() error {
		if w := g.Stats().Waiting; w != n {
			return fmt.Errorf("waiting = %d, want %d", w, n)
		}
		return nil
	})
}

func admitted(ch <-chan *Ticket) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestEnterWaitsForASlot(t *testing.T) {
	t.Parallel()
	g := New(2, time.Hour)
	a, err := g.Enter(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Enter(t.Context()); err != nil {
		t.Fatal(err)
	}
	third := enterAsync(t, t.Context(), g)
	waitWaiting(t, g, 1)
	if admitted(third) {
		t.Fatal("a third caller was admitted to two slots")
	}
	if st := g.Stats(); st != (Stats{Admitted: 2, Waiting: 1}) {
		t.Errorf("Stats = %+v, want 2 admitted, 1 waiting", st)
	}
	a.Leave()
	select {
	case tk := <-third:
		if tk == nil {
			t.Fatal("admitted without a ticket")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Leave did not admit the caller waiting")
	}
	if st := g.Stats(); st != (Stats{Admitted: 2}) {
		t.Errorf("Stats = %+v, want 2 admitted, none waiting", st)
	}
}

func TestArrivalOrder(t *testing.T) {
	t.Parallel()
	g := New(1, time.Hour)
	first, err := g.Enter(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var chs []<-chan *Ticket
	for i := range 5 {
		chs = append(chs, enterAsync(t, t.Context(), g))
		waitWaiting(t, g, i+1)
	}
	prev := first
	for i, ch := range chs {
		prev.Leave()
		select {
		case prev = <-ch:
		case <-time.After(5 * time.Second):
			t.Fatalf("caller %d not admitted after the one before it left", i)
		}
		for j, later := range chs[i+1:] {
			if admitted(later) {
				t.Fatalf("caller %d admitted before caller %d", i+1+j, i)
			}
		}
	}
}

func TestHoldEnds(t *testing.T) {
	t.Parallel()
	g := New(1, 20*time.Millisecond)
	tk, err := g.Enter(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	// tk never leaves: the hold time ends its claim.
	select {
	case <-enterAsync(t, t.Context(), g):
	case <-time.After(5 * time.Second):
		t.Fatal("the slot was not freed after the hold time")
	}
	tk.Leave() // after its hold time: frees nothing more
	if st := g.Stats(); st.Admitted != 1 && st.Admitted != 0 {
		t.Errorf("Admitted = %d after a late Leave", st.Admitted)
	}
}

func TestLeaveOnce(t *testing.T) {
	t.Parallel()
	g := New(2, time.Hour)
	a, _ := g.Enter(t.Context())
	b, _ := g.Enter(t.Context())
	a.Leave()
	a.Leave()
	if st := g.Stats(); st.Admitted != 1 {
		t.Fatalf("Admitted = %d after one ticket left twice, want 1", st.Admitted)
	}
	third := enterAsync(t, t.Context(), g)
	<-third
	fourth := enterAsync(t, t.Context(), g)
	waitWaiting(t, g, 1)
	if admitted(fourth) {
		t.Fatal("a second Leave freed a second slot")
	}
	b.Leave()
	<-fourth
}

// TestWaitedWithin: only a caller of Enter that finds no slot free counts
// as a wait; Take beyond the limit does not, and the wait ages out.
func TestWaitedWithin(t *testing.T) {
	t.Parallel()
	g := New(1, time.Hour)
	run, _ := g.Enter(t.Context())
	g.Take().Leave()
	if g.WaitedWithin(time.Hour) {
		t.Fatal("a wait counted where every Enter found a slot")
	}
	next := enterAsync(t, t.Context(), g)
	waitWaiting(t, g, 1)
	run.Leave()
	(<-next).Leave()
	if !g.WaitedWithin(time.Hour) {
		t.Fatal("a caller waited, and WaitedWithin says not")
	}
	time.Sleep(20 * time.Millisecond)
	if g.WaitedWithin(10 * time.Millisecond) {
		t.Fatal("WaitedWithin(10ms) 20 ms after the wait")
	}
}

func TestTakeCountsButDoesNotWait(t *testing.T) {
	t.Parallel()
	g := New(1, time.Hour)
	run, _ := g.Enter(t.Context())
	scrubs := []*Ticket{g.Take(), g.Take()} // beyond the limit, at once
	if st := g.Stats(); st.Admitted != 3 {
		t.Fatalf("Admitted = %d, want 3", st.Admitted)
	}
	next := enterAsync(t, t.Context(), g)
	waitWaiting(t, g, 1)
	run.Leave()
	scrubs[0].Leave()
	if admitted(next) {
		t.Fatal("admitted while a taken slot still counts")
	}
	scrubs[1].Leave()
	select {
	case <-next:
	case <-time.After(5 * time.Second):
		t.Fatal("not admitted once every slot was free")
	}
}

func TestEnterContextEnds(t *testing.T) {
	t.Parallel()
	g := New(1, time.Hour)
	tk, _ := g.Enter(t.Context())
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	got, err := g.Enter(ctx)
	if !errors.Is(err, ErrSaturated) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Enter = %v, %v; want ErrSaturated and the deadline", got, err)
	}
	if st := g.Stats(); st != (Stats{Admitted: 1}) {
		t.Fatalf("Stats = %+v: the caller that gave up still waits", st)
	}
	tk.Leave()
	if st := g.Stats(); st != (Stats{}) {
		t.Fatalf("Stats = %+v: the slot went to a caller that gave up", st)
	}
}

// TestConcurrent admits many callers through few slots and checks that no
// more than the slots ever held one at once.
func TestConcurrent(t *testing.T) {
	t.Parallel()
	const slots, callers = 3, 64
	g := New(slots, time.Hour)
	var (
		mu        sync.Mutex
		in, most  int
		wg        sync.WaitGroup
		failed    error
		admittedN int
	)
	for range callers {
		wg.Go(func() {
			tk, err := g.Enter(t.Context())
			mu.Lock()
			if err != nil {
				failed = err
			}
			in++
			admittedN++
			most = max(most, in)
			mu.Unlock()
			time.Sleep(time.Millisecond) // hold the slot a moment
			mu.Lock()
			in--
			mu.Unlock()
			tk.Leave()
		})
	}
	wg.Wait()
	if failed != nil {
		t.Fatal(failed)
	}
	if most > slots || admittedN != callers {
		t.Fatalf("at most %d at once (want <= %d), %d admitted (want %d)", most, slots, admittedN, callers)
	}
	if st := g.Stats(); st != (Stats{}) {
		t.Fatalf("Stats = %+v after everyone left", st)
	}
}

func TestNoLimit(t *testing.T) {
	t.Parallel()
	for _, g := range []*Gate{nil, New(0, time.Second)} {
		for range 100 {
			tk, err := g.Enter(t.Context())
			if err != nil || tk != nil {
				t.Fatalf("Enter = %v, %v; want no ticket, no error", tk, err)
			}
			tk.Leave()
		}
		g.Take().Leave()
		if g.WaitedWithin(time.Hour) {
			t.Fatal("WaitedWithin of a gate without limit")
		}
		if st := g.Stats(); st != (Stats{}) || g.Slots() != 0 {
			t.Fatalf("Stats = %+v, Slots = %d of a gate without limit", st, g.Slots())
		}
	}
}

func TestTakeHasNoHoldTime(t *testing.T) {
	t.Parallel()
	g := New(1, 10*time.Millisecond)
	scrub := g.Take()
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	if _, err := g.Enter(ctx); !errors.Is(err, ErrSaturated) {
		t.Fatalf("Enter = %v while a taken slot is held past the hold time, want ErrSaturated", err)
	}
	scrub.Leave()
	if _, err := g.Enter(t.Context()); err != nil {
		t.Fatal(err)
	}
}
