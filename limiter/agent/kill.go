package agent

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// PidfdKiller kills host processes through a pidfd (pidfd_open(2), Linux
// 5.3+), so the start-time check and the signal address the same process
// even if the pid is reused in between. The agent needs the host's pid
// namespace and CAP_KILL. The zero value reads the start time from /proc.
type PidfdKiller struct {
	Proc ProcFS
}

var _ Killer = PidfdKiller{}

// Kill sends SIGKILL to pid if its start time is still startTicks.
func (k PidfdKiller) Kill(pid uint32, startTicks uint64) error {
	fd, err := unix.PidfdOpen(int(pid), 0)
	if errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("kill pid %d: %w", pid, ErrNoProcess)
	}
	if err != nil {
		return fmt.Errorf("kill pid %d: pidfd_open: %w", pid, err)
	}
	defer unix.Close(fd)
	proc := k.Proc
	if proc.Root == "" {
		proc.Root = "/proc"
	}
	// The pidfd pins the process: if the start time matches now, the
	// signal below reaches this process or fails with ESRCH.
	start, err := proc.StartTime(pid)
	if err != nil {
		return fmt.Errorf("kill pid %d: %w", pid, err)
	}
	if start != startTicks {
		return fmt.Errorf("kill pid %d: started at %d, not %d: %w", pid, start, startTicks, ErrNoProcess)
	}
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil {
		if errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("kill pid %d: %w", pid, ErrNoProcess)
		}
		return fmt.Errorf("kill pid %d: %w", pid, err)
	}
	return nil
}
