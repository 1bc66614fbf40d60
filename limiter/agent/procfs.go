package agent

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
)

// ErrNoProcess is returned (wrapped) when a pid has no /proc entry: the
// process exited between NVML's report and the read.
var ErrNoProcess = errors.New("agent: no such process")

// ProcFS reads what the agent needs about a process from a proc(5) tree.
// Root is the tree's mount point: "/proc" when the agent runs with the
// host's pid namespace (hostPID: true), or the host's /proc mounted
// elsewhere. The zero value is not usable. It is safe for concurrent use.
type ProcFS struct {
	Root string
}

// Process is what the agent knows about a host pid.
type Process struct {
	PID uint32 // in the pid namespace of Root
	// PodUID is the Kubernetes pod UID from the process's cgroup path, ""
	// when the process is not in a kubepods cgroup.
	PodUID string
	// ContainerID is the container runtime's id from the cgroup path, ""
	// when unknown.
	ContainerID string
	// NSPid is the pid in the process's innermost pid namespace (the last
	// NSpid field of status); equal to PID without namespaces. The hooks
	// write this pid into the usage region.
	NSPid uint32
	// StartTimeTicks is field 22 of stat: start time in clock ticks after
	// boot; the same in every pid namespace. With PID it names the process
	// across pid reuse.
	StartTimeTicks uint64
}

// Process reads pid's cgroup, status and stat files. A missing process is
// an error wrapping ErrNoProcess.
func (p ProcFS) Process(pid uint32) (Process, error) {
	dir := filepath.Join(p.Root, strconv.FormatUint(uint64(pid), 10))
	out := Process{PID: pid, NSPid: pid}
	stat, err := os.ReadFile(filepath.Join(dir, "stat")) // #nosec G304 -- a proc(5) path built from a pid
	if err != nil {
		return out, procErr(pid, "stat", err)
	}
	if out.StartTimeTicks, err = ParseStartTime(stat); err != nil {
		return out, fmt.Errorf("pid %d: %w", pid, err)
	}
	cg, err := os.ReadFile(filepath.Join(dir, "cgroup")) // #nosec G304 -- a proc(5) path built from a pid
	if err != nil {
		return out, procErr(pid, "cgroup", err)
	}
	out.PodUID, out.ContainerID = ParseCgroup(cg)
	status, err := os.ReadFile(filepath.Join(dir, "status")) // #nosec G304 -- a proc(5) path built from a pid
	if err != nil {
		return out, procErr(pid, "status", err)
	}
	if ns, ok := parseNSPid(status); ok {
		out.NSPid = ns
	}
	return out, nil
}

// StartTime reads only pid's start time (stat field 22), in clock ticks.
func (p ProcFS) StartTime(pid uint32) (uint64, error) {
	stat, err := os.ReadFile(filepath.Join(p.Root, strconv.FormatUint(uint64(pid), 10), "stat")) // #nosec G304 -- a proc(5) path built from a pid
	if err != nil {
		return 0, procErr(pid, "stat", err)
	}
	t, err := ParseStartTime(stat)
	if err != nil {
		return 0, fmt.Errorf("pid %d: %w", pid, err)
	}
	return t, nil
}

func procErr(pid uint32, file string, err error) error {
	// A process that exits mid-read yields ENOENT or ESRCH.
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("pid %d %s: %w: %w", pid, file, ErrNoProcess, err)
	}
	return fmt.Errorf("pid %d %s: %w", pid, file, err)
}

// ParseStartTime returns field 22 (starttime) of a proc(5) stat line. The
// command name (field 2) may hold spaces and parentheses, so fields are
// counted after its last ')'.
func ParseStartTime(stat []byte) (uint64, error) {
	end := bytes.LastIndexByte(stat, ')')
	if end < 0 {
		return 0, errors.New("stat: no command name")
	}
	// After ") " come fields 3.. ; starttime is field 22, the 20th of them.
	f := strings.Fields(string(stat[end+1:]))
	if len(f) < 20 {
		return 0, fmt.Errorf("stat: %d fields after the command name, want >= 20", len(f))
	}
	t, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("stat starttime: %w", err)
	}
	return t, nil
}

// parseNSPid returns the last NSpid value of a status file.
func parseNSPid(status []byte) (uint32, bool) {
	for _, line := range strings.Split(string(status), "\n") {
		rest, ok := strings.CutPrefix(line, "NSpid:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			return 0, false
		}
		n, err := strconv.ParseUint(f[len(f)-1], 10, 32)
		if err != nil {
			return 0, false
		}
		return uint32(n), true
	}
	return 0, false
}

// podSegment matches the pod component of a kubepods cgroup path in both
// drivers: "pod<uid>" (cgroupfs) and "kubepods-<qos>-pod<uid_with_underscores>.slice"
// (systemd).
var podSegment = regexp.MustCompile(`pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})(\.slice)?$`)

// containerSegment matches a container component: an optional runtime
// prefix, the id, and an optional ".scope".
var containerSegment = regexp.MustCompile(`^(?:cri-containerd-|docker-|crio-|containerd-|libpod-)?([0-9a-f]{12,64})(?:\.scope)?$`)

// ParseCgroup returns the pod UID (with dashes) and container id found in a
// /proc/<pid>/cgroup file, cgroup v1 or v2, cgroupfs or systemd driver;
// both are "" when the process is in no kubepods cgroup. With v1, the first
// hierarchy whose path names a pod wins (all name the same pod).
func ParseCgroup(b []byte) (podUID, containerID string) {
	for _, line := range strings.Split(string(b), "\n") {
		// hierarchy-ID:controller-list:cgroup-path; the path may contain ':'.
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || !strings.Contains(parts[2], "kubepods") {
			continue
		}
		segs := strings.Split(parts[2], "/")
		for i, s := range segs {
			m := podSegment.FindStringSubmatch(s)
			if m == nil {
				continue
			}
			podUID = strings.ReplaceAll(m[1], "_", "-")
			if i+1 < len(segs) {
				if c := containerSegment.FindStringSubmatch(segs[i+1]); c != nil {
					containerID = c[1]
				}
			}
			return podUID, containerID
		}
	}
	return "", ""
}
