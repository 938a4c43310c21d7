package sandbox

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Priority is how a sandbox shares the host's CPUs with the others when
// they are all busy. It is the CPU weight of the sandbox's cgroup, which
// holds its gVisor kernel and everything running in it.
type Priority int

const (
	// PriorityNormal is the engine's default weight: a sandbox serving a
	// request.
	PriorityNormal Priority = iota
	// PriorityLow is for work no caller waits on: a sandbox being scrubbed
	// (with its next interpreter prestarted) or started ahead of demand.
	// It gets the CPUs the others leave idle.
	PriorityLow
)

// Weights of the two priorities: cgroup v1's cpu.shares (2 to 262144,
// default 1024) and v2's cpu.weight (1 to 10000, default 100).
var (
	v1Shares = [...]string{PriorityNormal: "1024", PriorityLow: "2"}
	v2Weight = [...]string{PriorityNormal: "100", PriorityLow: "1"}
)

// cpuWeightFile returns the file that sets the CPU weight of the cgroup of
// process pid, as this host mounts it, and the values of the priorities
// for it.
func cpuWeightFile(pid int) (string, [2]string, error) {
	cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return "", [2]string{}, err
	}
	v1, v2 := cgroupMounts()
	for line := range strings.SplitSeq(strings.TrimSpace(string(cg)), "\n") {
		// hierarchy-id:controller-list:path
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			if v2 != "" && parts[2] != "/" {
				return filepath.Join(v2, parts[2], "cpu.weight"), v2Weight, nil
			}
			continue
		}
		if m, ok := v1["cpu"]; ok && slices.Contains(strings.Split(parts[1], ","), "cpu") {
			return filepath.Join(m, parts[2], "cpu.shares"), v1Shares, nil
		}
	}
	return "", [2]string{}, errors.New("no cpu cgroup found for the sandbox")
}

// cgroupMounts returns where this host mounts cgroup v1 controllers (by
// controller) and the cgroup v2 hierarchy ("" if it does not).
func cgroupMounts() (v1 map[string]string, v2 string) {
	v1 = map[string]string{}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return v1, ""
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		// id parent major:minor root mount-point options [optional...] - fstype source super-options
		fields := strings.Fields(s.Text())
		sep := -1
		for i, f := range fields {
			if f == "-" {
				sep = i
				break
			}
		}
		if sep < 5 || sep+3 >= len(fields) {
			continue
		}
		switch fields[sep+1] {
		case "cgroup2":
			v2 = fields[4]
		case "cgroup":
			for o := range strings.SplitSeq(fields[sep+3], ",") {
				v1[o] = fields[4]
			}
		}
	}
	return v1, v2
}

// priorities sets the CPU weight of one container's cgroup; the zero value
// does nothing.
type priorities struct {
	file   string
	values [2]string
	cur    Priority
}

func newPriorities(pid int) (*priorities, error) {
	if pid <= 0 {
		return nil, errors.New("no process id")
	}
	file, values, err := cpuWeightFile(pid)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(file); err != nil {
		return nil, err
	}
	return &priorities{file: file, values: values}, nil
}

func (p *priorities) set(pr Priority) error {
	if p == nil || pr == p.cur {
		return nil
	}
	if pr < 0 || int(pr) >= len(p.values) {
		return fmt.Errorf("priority %d out of range", pr)
	}
	if err := os.WriteFile(p.file, []byte(p.values[pr]), 0); err != nil {
		return fmt.Errorf("set CPU weight: %w", err)
	}
	p.cur = pr
	return nil
}

// weight reads the weight the file holds now, for tests.
func (p *priorities) weight() (int, error) {
	b, err := os.ReadFile(p.file)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}
