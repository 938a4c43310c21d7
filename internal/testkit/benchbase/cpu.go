package benchbase

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// userHZ is the unit of the CPU times in /proc: USER_HZ, 100 on Linux.
const userHZ = 100

// ProcStat is what the benchmarks read of /proc/PID/stat.
type ProcStat struct {
	Comm string        // the command's name, without its parentheses
	CPU  time.Duration // user and system time so far
}

// ParseProcStat parses the contents of /proc/PID/stat. The command's name
// may contain spaces and parentheses; it ends at the last ')'.
func ParseProcStat(data []byte) (ProcStat, error) {
	open, closing := bytes.IndexByte(data, '('), bytes.LastIndexByte(data, ')')
	if open < 0 || closing < open {
		return ProcStat{}, errors.New("proc stat: no command name")
	}
	fields := strings.Fields(string(data[closing+1:]))
	// After the name: state (field 3 of proc(5)) ... utime (14), stime (15).
	if len(fields) < 13 {
		return ProcStat{}, fmt.Errorf("proc stat: %d fields after the name", len(fields))
	}
	ut, err1 := strconv.ParseInt(fields[11], 10, 64)
	st, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return ProcStat{}, fmt.Errorf("proc stat: %w", err)
	}
	return ProcStat{Comm: string(data[open+1 : closing]), CPU: ticks(ut + st)}, nil
}

// ProcessCPU returns the CPU time process pid has used so far.
func ProcessCPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	s, err := ParseProcStat(data)
	return s.CPU, err
}

// HostCPU returns the time the host's CPUs have been busy so far, summed
// over all of them: every state of /proc/stat's "cpu" line but idle and
// iowait. Guest time is already counted in user time, and steal time is
// not the host's own work, so neither is added.
func HostCPU() (time.Duration, error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return 0, errors.New("/proc/stat: empty")
	}
	return parseHostCPU(sc.Text())
}

// parseHostCPU parses the "cpu" line of /proc/stat: user nice system idle
// iowait irq softirq steal guest guest_nice.
func parseHostCPU(line string) (time.Duration, error) {
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0, fmt.Errorf("/proc/stat: first line %q", line)
	}
	var busy int64
	for i, name := range []string{"user", "nice", "system", "idle", "iowait", "irq", "softirq"} {
		n, err := strconv.ParseInt(f[i+1], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/stat: %s: %w", name, err)
		}
		if name != "idle" && name != "iowait" {
			busy += n
		}
	}
	return ticks(busy), nil
}

func ticks(n int64) time.Duration { return time.Duration(n) * time.Second / userHZ }
