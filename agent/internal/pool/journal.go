package pool

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"
)

// A Journal keeps, on disk, which sessions an agent opened and how each
// ended, so that an agent that restarts knows the sessions it lost: a call
// for one of them is then not_found ("lost"), never a new, empty session
// under the same id.
//
// It is an append-only file of JSON lines, one per session opened or ended.
// OpenJournal reads it, counts every session opened and not ended as lost
// when the agent stopped, and rewrites it with what is remembered (at most
// MaxEnded ended sessions, the newest). Lines are written without fsync: a
// crash of the host may lose the last few, which costs only that guarantee
// for those sessions.
//
// A Journal is safe for concurrent use.
type Journal struct {
	path   string
	replay map[string]ended // what the file held when opened, for NewSessions

	mu sync.Mutex
	f  *os.File
}

// journalRecord is one line of the journal.
type journalRecord struct {
	Op     string    `json:"op"` // "open" or "end"
	ID     string    `json:"id"`
	Tenant string    `json:"tenant,omitempty"`
	Reason EndReason `json:"reason,omitempty"`
	Time   time.Time `json:"time"`
}

// OpenJournal opens (creating it if needed) the journal in dir. Give it to
// NewSessions, which then remembers the sessions it records as ended, lost
// ones included.
func OpenJournal(dir string) (*Journal, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("session journal: %w", err)
	}
	path := filepath.Join(dir, "sessions.jsonl")
	gone, err := replay(path)
	if err != nil {
		return nil, err
	}
	if err := rewrite(path, gone); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("session journal: %w", err)
	}
	return &Journal{path: path, replay: gone, f: f}, nil
}

// Lost returns how many sessions the journal recorded as lost.
func (j *Journal) Lost() int {
	n := 0
	for _, e := range j.replay {
		if e.reason == EndLost {
			n++
		}
	}
	return n
}

// replay reads the journal at path: every session ended, and every session
// opened and not ended, as lost when the file was last written.
func replay(path string) (map[string]ended, error) {
	gone := map[string]ended{}
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return gone, nil
	}
	if err != nil {
		return nil, fmt.Errorf("session journal: %w", err)
	}
	defer f.Close()
	stopped := time.Now()
	if st, err := f.Stat(); err == nil {
		stopped = st.ModTime()
	}
	open := map[string]string{} // id -> tenant
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 4096), 1<<20)
	for sc.Scan() {
		var r journalRecord
		if json.Unmarshal(sc.Bytes(), &r) != nil || r.ID == "" {
			continue // a line cut short by a crash
		}
		switch r.Op {
		case "open":
			open[r.ID] = r.Tenant
		case "end":
			delete(open, r.ID)
			gone[r.ID] = ended{tenant: r.Tenant, reason: r.Reason, at: r.Time}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("session journal %s: %w", path, err)
	}
	for id, tenant := range open {
		gone[id] = ended{tenant: tenant, reason: EndLost, at: stopped}
	}
	return gone, nil
}

// rewrite replaces the journal at path with the newest MaxEnded of gone.
func rewrite(path string, gone map[string]ended) error {
	ids := make([]string, 0, len(gone))
	for id := range gone {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return gone[ids[i]].at.Before(gone[ids[j]].at) })
	if len(ids) > MaxEnded {
		for _, id := range ids[:len(ids)-MaxEnded] {
			delete(gone, id)
		}
		ids = ids[len(ids)-MaxEnded:]
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".sessions-*.jsonl")
	if err != nil {
		return fmt.Errorf("session journal: %w", err)
	}
	defer os.Remove(tmp.Name())
	w := bufio.NewWriter(tmp)
	enc := json.NewEncoder(w)
	for _, id := range ids {
		e := gone[id]
		if err := enc.Encode(journalRecord{Op: "end", ID: id, Tenant: e.tenant, Reason: e.reason, Time: e.at}); err != nil {
			tmp.Close()
			return err
		}
	}
	if err := w.Flush(); err != nil {
		tmp.Close()
		return fmt.Errorf("session journal: %w", err)
	}
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("session journal: %w", err)
	}
	return nil
}

func (j *Journal) append(r journalRecord) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.f == nil {
		return errors.New("session journal closed")
	}
	_, err = j.f.Write(append(b, '\n'))
	return err
}

// Opened records that tenant's session id opened.
func (j *Journal) Opened(id, tenant string, at time.Time) error {
	return j.append(journalRecord{Op: "open", ID: id, Tenant: tenant, Time: at})
}

// Ended records that tenant's session id ended for reason.
func (j *Journal) Ended(id, tenant string, reason EndReason, at time.Time) error {
	return j.append(journalRecord{Op: "end", ID: id, Tenant: tenant, Reason: reason, Time: at})
}

// Close closes the journal's file.
func (j *Journal) Close() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.f == nil {
		return nil
	}
	err := j.f.Close()
	j.f = nil
	return err
}
