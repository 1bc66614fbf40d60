package harness

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// Process is a child process in its own process group whose stdout and
// stderr go to one log file. Its methods are safe for concurrent use.
type Process struct {
	// Name labels the process in errors and log dumps.
	Name string
	// LogPath is the file holding the process's stdout and stderr.
	LogPath string

	cmd     *exec.Cmd
	done    chan struct{} // closed once cmd.Wait returned
	waitErr error         // set before done is closed
}

// StartProcess starts bin with args in a new process group, appending its
// output to logPath (created if missing). env, when not nil, replaces the
// environment. The process gets SIGKILL if the test binary dies first.
// The caller must call Stop or Kill.
func StartProcess(name, logPath string, env []string, bin string, args ...string) (*Process, error) {
	return startProcessIn("", name, logPath, env, bin, args...)
}

// startProcessIn is StartProcess with the working directory dir ("" : this
// process's).
func startProcessIn(dir, name, logPath string, env []string, bin string, args ...string) (*Process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("%s: open log: %w", name, err)
	}
	defer logFile.Close() // the child holds its own descriptor
	fmt.Fprintf(logFile, "=== %s %s %s\n", time.Now().UTC().Format(time.RFC3339Nano), bin, strings.Join(args, " "))
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.Dir = dir
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s: start %s: %w", name, bin, err)
	}
	p := &Process{Name: name, LogPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// Pid returns the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Exited is closed when the process has exited and was reaped.
func (p *Process) Exited() <-chan struct{} { return p.done }

// ExitErr returns the result of waiting for the process; valid once Exited
// is closed.
func (p *Process) ExitErr() error {
	<-p.done
	return p.waitErr
}

// Stop sends SIGTERM to the process group, waits up to grace for the process
// to exit, then sends SIGKILL to the group and waits for it. It returns nil
// when the process is gone, whatever its exit status.
func (p *Process) Stop(grace time.Duration) error {
	select {
	case <-p.done:
		p.signalGroup(syscall.SIGKILL) // stray children of the group
		return nil
	default:
	}
	p.signalGroup(syscall.SIGTERM)
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-p.done:
		p.signalGroup(syscall.SIGKILL)
		return nil
	case <-timer.C:
	}
	return p.Kill()
}

// Kill sends SIGKILL to the process group and waits up to 10 s for the
// process to be reaped.
func (p *Process) Kill() error {
	p.signalGroup(syscall.SIGKILL)
	select {
	case <-p.done:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s (pid %d): still running 10s after SIGKILL", p.Name, p.Pid())
	}
}

// signal sends sig to the process itself (not its group).
func (p *Process) signal(sig syscall.Signal) error {
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("%s (pid %d): %s: %w", p.Name, p.Pid(), sig, err)
	}
	return nil
}

func (p *Process) signalGroup(sig syscall.Signal) {
	// A negative pid addresses the process group. ESRCH (group gone) is fine.
	if err := syscall.Kill(-p.cmd.Process.Pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		_ = p.cmd.Process.Signal(sig)
	}
}

// LogTail returns up to the last n lines of the process's log file, or a
// line saying why it could not be read.
func (p *Process) LogTail(n int) string {
	return TailFile(p.LogPath, n)
}

// TailFile returns up to the last n lines of the file at path, or a line
// saying why it could not be read.
func TailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %s)", path, err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago. The
// kernel does not hand out a just-closed ephemeral port again at once, so the
// race with other processes is small.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("free port: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		return 0, fmt.Errorf("free port: close: %w", err)
	}
	return port, nil
}
