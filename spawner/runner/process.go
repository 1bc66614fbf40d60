package runner

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// Limits of a termination message read from the container's output, the
// kubelet's (FallbackToLogsOnError): the last 80 lines, at most 2048 bytes.
const (
	messageLines = 80
	messageBytes = 2048
)

// process is one started container process in its own process group.
type process struct {
	cmd     *exec.Cmd
	log     string        // path of its output
	started time.Time     // when it was started
	done    chan struct{} // closed once reaped
	exit    exitResult    // valid after done
}

// exitResult is how a process ended.
type exitResult struct {
	code     int32
	signal   int32
	finished time.Time
}

// start starts l's process with output appended to logPath. The process
// gets its own process group and is killed if this process dies first.
func start(l launch, logPath string) (*process, error) {
	out, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("container log: %w", err)
	}
	defer out.Close() // the child holds its own descriptor
	cmd := &exec.Cmd{Path: l.argv[0], Args: l.argv, Env: l.env, Dir: l.dir, Stdout: out, Stderr: out}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &process{cmd: cmd, log: logPath, started: time.Now(), done: make(chan struct{})}
	go func() { // reaps the child; ends with it
		err := cmd.Wait()
		p.exit = exitOf(cmd, err)
		close(p.done)
	}()
	return p, nil
}

// exitOf reads a reaped command's end: a signal death reports 128+signal as
// the exit code, as container runtimes do.
func exitOf(cmd *exec.Cmd, err error) exitResult {
	r := exitResult{finished: time.Now()}
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		r.code = 128
		return r
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		r.signal = int32(ws.Signal())
		r.code = 128 + r.signal
		return r
	}
	r.code = int32(cmd.ProcessState.ExitCode())
	return r
}

// signal sends sig to the process's group.
func (p *process) signal(sig syscall.Signal) error {
	if err := syscall.Kill(-p.cmd.Process.Pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("signal %s to process group %d: %w", sig, p.cmd.Process.Pid, err)
	}
	return nil
}

// stop sends SIGTERM to the process group, then SIGKILL after grace or as
// soon as ctx is done, and returns once the process is reaped. Any
// processes it left in its group are killed too.
func (p *process) stop(ctx context.Context, grace time.Duration) {
	select {
	case <-p.done:
		_ = p.signal(syscall.SIGKILL) // leftovers in the group
		return
	default:
	}
	_ = p.signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
	case <-ctx.Done():
	}
	_ = p.signal(syscall.SIGKILL)
	<-p.done
}

// tailFile returns the last n lines of the file at path (at most 64 KiB
// are read), or "" when it cannot be read.
func tailFile(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	const window = 64 << 10
	st, err := f.Stat()
	if err != nil {
		return ""
	}
	off := max(st.Size()-window, 0)
	buf := make([]byte, st.Size()-off)
	if _, err := f.ReadAt(buf, off); err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(buf), "\n"), "\n")
	if off > 0 && len(lines) > 1 {
		lines = lines[1:] // the first one is cut
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// terminationMessage is the kubelet's fallback message from the output: the
// last messageLines lines, cut to the last messageBytes bytes.
func terminationMessage(logPath string, sinceOffset int64) string {
	f, err := os.Open(logPath)
	if err != nil {
		return ""
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || st.Size() <= sinceOffset {
		return ""
	}
	off := max(sinceOffset, st.Size()-64<<10)
	buf := make([]byte, st.Size()-off)
	if _, err := f.ReadAt(buf, off); err != nil {
		return ""
	}
	buf = bytes.TrimRight(buf, "\n")
	lines := bytes.Split(buf, []byte("\n"))
	if len(lines) > messageLines {
		lines = lines[len(lines)-messageLines:]
	}
	msg := bytes.Join(lines, []byte("\n"))
	if len(msg) > messageBytes {
		msg = msg[len(msg)-messageBytes:]
	}
	return string(msg)
}
