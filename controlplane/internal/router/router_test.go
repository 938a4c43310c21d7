package router

import (
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"testing"
	"time"

	agentv1 "github.com/codemode-go/codemode/gen/codemode/agent/v1"
)

func newTestRouter(t *testing.T, free ...int32) *Router {
	t.Helper()
	var addrs []string
	for i := range free {
		addrs = append(addrs, "127.0.0.1:"+string(rune('1'+i))+"0000")
	}
	r, err := New(Config{Addresses: addrs})
	if err != nil {
		t.Fatal(err)
	}
	for i, a := range r.agents {
		a.status = &agentv1.AgentStatus{Free: free[i], Ready: true}
		a.healthy = true
	}
	return r
}

func TestPickCountsInFlight(t *testing.T) {
	t.Parallel()
	r := newTestRouter(t, 3, 2)
	first, err := r.Pick(nil)
	if err != nil || first != r.agents[0] {
		t.Fatalf("first pick %v %v, want the agent with 3 free", first, err)
	}
	// Two runs in flight on the first agent leave it 1 free: the second wins.
	release1 := first.Acquire()
	release2 := first.Acquire()
	if got, _ := r.Pick(nil); got != r.agents[1] {
		t.Fatalf("with 2 in flight picked %v, want the second agent", got)
	}
	release1()
	release2()
	release2() // releasing twice must not count twice
	if got, _ := r.Pick(nil); got != r.agents[0] {
		t.Fatalf("after release picked %v, want the first agent", got)
	}
	// A status read while a run is in flight counts it busy: the run is
	// not counted twice, and its end frees its place.
	release := first.Acquire()
	r.Register(t.Context(), first.Address, &agentv1.AgentStatus{Free: 2, Ready: true}, time.Second)
	if s, _ := first.score(); s.free != 2 {
		t.Fatalf("free %d with the run in the status, want 2", s.free)
	}
	release()
	if s, _ := first.score(); s.free != 3 {
		t.Fatalf("free %d after the run ended, want 3", s.free)
	}
}

func TestPickSkipsUnhealthyAndExcluded(t *testing.T) {
	t.Parallel()
	r := newTestRouter(t, 5, 1)
	r.agents[0].MarkDown(errTest)
	if got, _ := r.Pick(nil); got != r.agents[1] {
		t.Fatalf("picked %v, want the healthy agent", got)
	}
	if _, err := r.Pick(nil, r.agents[1]); err != ErrNoAgent {
		t.Fatalf("got %v, want ErrNoAgent", err)
	}
}

func TestSessionsAreForgottenAfterTTL(t *testing.T) {
	t.Parallel()
	r := newTestRouter(t, 1)
	ctx := t.Context()
	if _, _, err := r.PickSession(ctx, "s1", "t1", nil); err != nil {
		t.Fatal(err)
	}
	if err := r.store.Sweep(ctx, time.Now().Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, _, ok, _ := r.Session(ctx, "s1"); !ok {
		t.Fatal("a session used just now was forgotten")
	}
	if err := r.store.Sweep(ctx, time.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, _, ok, _ := r.Session(ctx, "s1"); ok {
		t.Fatal("a session unused past the cutoff is still remembered")
	}
}

func TestEndedSessionsStayEnded(t *testing.T) {
	t.Parallel()
	r := newTestRouter(t, 1)
	ctx := t.Context()
	a, _, err := r.PickSession(ctx, "s1", "t1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if b, _, _, _ := r.Session(ctx, "s1"); b.Confirmed || b.Tenant != "t1" {
		t.Errorf("binding %+v, want unconfirmed, of t1", b)
	}
	if err := r.Bind(ctx, "s1", "t1", a); err != nil {
		t.Fatal(err)
	}
	if b, got, _, _ := r.Session(ctx, "s1"); !b.Confirmed || got != a {
		t.Errorf("a bound session: %+v on %v, want confirmed on %v", b, got, a)
	}
	if err := r.MarkGone(ctx, "s1", executionv1.SessionNotFound_REASON_CLOSED, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, got, ok, _ := r.Session(ctx, "s1"); !ok || got != nil {
		t.Error("an ended session is still routed to")
	}
	if _, b, err := r.PickSession(ctx, "s1", "t1", nil); err != ErrSessionGone || b.Gone != executionv1.SessionNotFound_REASON_CLOSED {
		t.Errorf("PickSession of an ended session: %v %v, want ErrSessionGone, closed", err, b.Gone)
	}
	if err := r.Bind(ctx, "s1", "t1", a); err != nil {
		t.Fatal(err)
	}
	if b, _, _, _ := r.Session(ctx, "s1"); b.Gone != executionv1.SessionNotFound_REASON_CLOSED {
		t.Errorf("after Bind: %v, want closed", b.Gone)
	}
}

type testError string

func (e testError) Error() string { return string(e) }

const errTest = testError("connection refused")

func TestPickSharesInProportionToCapacity(t *testing.T) {
	t.Parallel()
	r, err := New(Config{Addresses: []string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"}})
	if err != nil {
		t.Fatal(err)
	}
	for i, capacity := range []int32{4, 4, 2} {
		r.agents[i].status = &agentv1.AgentStatus{Free: capacity, Capacity: capacity, Ready: true}
		r.agents[i].healthy = true
	}
	got := map[string]int{}
	run := 0 // longest run of picks of one agent
	var last *Agent
	for range 100 {
		a, err := r.Pick(nil)
		if err != nil {
			t.Fatal(err)
		}
		got[a.Address]++
		if a == last {
			run++
		} else {
			run = 1
		}
		if run > 2 {
			t.Fatalf("%s picked %d times in a row: want the shares interleaved", a.Address, run)
		}
		last = a
	}
	if got["127.0.0.1:1"] != 40 || got["127.0.0.1:2"] != 40 || got["127.0.0.1:3"] != 20 {
		t.Fatalf("picks %v, want 40, 40 and 20", got)
	}

	// Under load the largest free fraction wins over agents more than a
	// run short of it: 1 of 4 free loses to 2 of 2.
	r.agents[0].status.Free, r.agents[1].status.Free = 1, 1
	if a, _ := r.Pick(nil); a != r.agents[2] {
		t.Fatalf("picked %v, want the agent with all of its capacity free", a)
	}
}

func BenchmarkPick(b *testing.B) {
	r, err := New(Config{Addresses: []string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4"}})
	if err != nil {
		b.Fatal(err)
	}
	for i, a := range r.agents {
		a.status = &agentv1.AgentStatus{Free: int32(4 + i%2), Capacity: 8, Ready: true, Labels: map[string]string{"pool": "general"}}
		a.healthy = true
	}
	labels := map[string]string{"pool": "general"}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.Pick(labels); err != nil {
			b.Fatal(err)
		}
	}
}

// TestPickClosedLoopSharesFollowCapacity: callers that each send their next
// run when the last one ends, to agents of unequal speed, get shares in
// proportion to capacity, not to speed.
func TestPickClosedLoopSharesFollowCapacity(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		capacities []int32
		ticks      []int // how long a run takes on each agent
		callers    int
	}{
		{"equal capacity, unequal speed", []int32{4, 4, 4}, []int{2, 3, 4}, 3},
		{"half capacity, unequal speed", []int32{4, 4, 2}, []int{2, 3, 4}, 5},
		{"half capacity, fastest", []int32{4, 4, 2}, []int{4, 3, 2}, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var addrs []string
			for i := range tc.capacities {
				addrs = append(addrs, "127.0.0.1:"+string(rune('1'+i)))
			}
			r, err := New(Config{Addresses: addrs})
			if err != nil {
				t.Fatal(err)
			}
			total := int32(0)
			for i, c := range tc.capacities {
				r.agents[i].status = &agentv1.AgentStatus{Free: c, Capacity: c, Ready: true}
				r.agents[i].healthy = true
				total += c
			}
			type run struct {
				end     int
				release func()
			}
			index := map[*Agent]int{}
			for i, a := range r.agents {
				index[a] = i
			}
			got := make([]int, len(r.agents))
			const picks = 600
			n := 0
			pick := func(now int) run {
				a, err := r.Pick(nil)
				if err != nil {
					t.Fatal(err)
				}
				n++
				got[index[a]]++
				return run{end: now + tc.ticks[index[a]], release: a.Acquire()}
			}
			var runs []run
			for range tc.callers {
				runs = append(runs, pick(0))
			}
			for now := 1; n < picks; now++ {
				for i := range runs {
					if runs[i].end <= now && n < picks {
						runs[i].release()
						runs[i] = pick(now)
					}
				}
			}
			for i, c := range tc.capacities {
				want := float64(picks) * float64(c) / float64(total)
				if d := float64(got[i]) - want; d > want/5 || d < -want/5 {
					t.Errorf("agent %d (capacity %d, %d ticks a run) took %d of %d runs, want %.0f within 20%%", i, c, tc.ticks[i], got[i], picks, want)
				}
			}
			t.Logf("runs by agent: %v", got)
		})
	}
}
