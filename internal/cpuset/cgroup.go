package cpuset

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// errNoCpusetV1 is returned by V1Root when no cgroup v1 hierarchy holds the
// cpuset controller.
var errNoCpusetV1 = errors.New("no cgroup v1 hierarchy with the cpuset controller is mounted")

// V1Root returns where the cgroup v1 hierarchy that holds the cpuset
// controller is mounted, from /proc/self/mountinfo.
func V1Root() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTIONS
		pre, post, ok := strings.Cut(s.Text(), " - ")
		if !ok {
			continue
		}
		fields, tail := strings.Fields(pre), strings.Fields(post)
		if len(fields) < 5 || len(tail) < 3 || tail[0] != "cgroup" {
			continue
		}
		for _, opt := range strings.Split(tail[2], ",") {
			if opt == "cpuset" {
				return fields[4], nil
			}
		}
	}
	if err := s.Err(); err != nil {
		return "", err
	}
	return "", errNoCpusetV1
}

// PrepareEngine readies the cgroups of a Docker Engine on this host, which
// reports cgroup version and driver (its Info's CgroupVersion and
// CgroupDriver), for containers pinned to CPUs. Under cgroup v1 the cpuset
// cgroup the engine puts containers in starts with no CPUs, and runsc cannot
// pin a container under it until something fills it: PrepareEngine fills
// it (see FillV1).
func PrepareEngine(version, driver string) error {
	if version != "1" {
		return nil // under v2 an empty cpuset is its parent's
	}
	var parent string
	switch driver {
	case "cgroupfs":
		parent = "docker"
	case "systemd":
		parent = "system.slice"
	default:
		return fmt.Errorf("cgroup driver %q: its containers' parent cgroup is unknown", driver)
	}
	root, err := V1Root()
	if err != nil {
		return err
	}
	return FillV1(filepath.Join(root, parent))
}

// FillV1 makes the cgroup v1 cpuset directory dir, which it creates if need
// be, and each of its ancestors hold CPUs and memory nodes, copied from the
// nearest ancestor that has them, as runc does for a container's parents.
// A new cpuset cgroup starts with neither, and none of its children can then
// be given any: runsc fills a container's parents only when the container
// names no CPUs, so the first container pinned to CPUs under a parent that
// no other container has filled yet fails to start.
func FillV1(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create cgroup %s: %w", dir, err)
	}
	for _, name := range []string{"cpuset.cpus", "cpuset.mems"} {
		if _, err := fillV1(dir, name); err != nil {
			return err
		}
	}
	return nil
}

func fillV1(dir, name string) (string, error) {
	path := filepath.Join(dir, name)
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	if v := strings.TrimSpace(string(b)); v != "" {
		return v, nil
	}
	v, err := fillV1(filepath.Dir(dir), name)
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(path, []byte(v), 0o644); err != nil {
		return "", fmt.Errorf("write %s: %w", path, err)
	}
	return v, nil
}
