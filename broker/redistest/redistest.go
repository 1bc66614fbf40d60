// Package redistest runs a real redis-server for tests: on 127.0.0.1 at an
// ephemeral port, without persistence (--save "" --appendonly no), in its
// own temporary directory, stopped when the test ends.
//
// The binary is /usr/bin/redis-server unless the environment variable
// GPUBROKER_TEST_REDIS_SERVER names another one. When the binary is missing
// Start fails the test, naming the Debian package and how to install it
// (e2e/testdeps); only under `go test -short` does it skip. This environment
// read is the only one in the project outside the configuration packages; it
// exists because this package is test support.
//
// Tests never use :6379 and never FLUSHDB a server they share: each test
// takes its own key prefix from Server.Prefix, or starts its own server.
package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/gpubroker/gpubroker/e2e/testdeps"
)

// DefaultBinary is the redis-server used when GPUBROKER_TEST_REDIS_SERVER is
// unset (Debian's redis-server package).
const DefaultBinary = "/usr/bin/redis-server"

// Timeouts of the process lifecycle.
const (
	// readyTimeout bounds the wait for the first PONG of a new process.
	readyTimeout = 10 * time.Second
	// stopTimeout is how long Stop waits after SIGTERM before SIGKILL.
	stopTimeout = 5 * time.Second
	// bindAttempts is how often StartProcess tries a new port when the
	// chosen one was taken between choosing it and redis binding it.
	bindAttempts = 5
)

// Binary returns the redis-server path to run: GPUBROKER_TEST_REDIS_SERVER
// if set, else DefaultBinary.
func Binary() string {
	if b := os.Getenv("GPUBROKER_TEST_REDIS_SERVER"); b != "" {
		return b
	}
	return DefaultBinary
}

// Process is one redis-server child process. Its methods are safe for
// concurrent use. The owner must call Stop.
type Process struct {
	binary string
	dir    string
	extra  []string // more redis-server arguments

	mu      sync.Mutex
	port    int
	cmd     *exec.Cmd
	exited  chan struct{} // closed when cmd has been waited for
	waitErr error
}

// StartProcess starts redis-server from Binary() on 127.0.0.1 at a free port
// with its working directory and log file in dir (which must exist) and
// the extra arguments after the defaults (for example "--replicaof",
// "127.0.0.1 6380"), and returns once it answers PING. ctx bounds only the start; the process runs
// until Stop. The error wraps exec's error when the binary cannot run.
func StartProcess(ctx context.Context, dir string, extra ...string) (*Process, error) {
	p := &Process{binary: Binary(), dir: dir, extra: extra}
	var errs []error
	for range bindAttempts {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		err = p.start(ctx, port)
		if err == nil {
			return p, nil
		}
		errs = append(errs, err)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) || ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("start redis-server: %w", errors.Join(errs...))
}

// freePort asks the kernel for a free TCP port on 127.0.0.1. Another process
// may take it before redis binds it; StartProcess retries then.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pick a free port: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		return 0, fmt.Errorf("pick a free port: %w", err)
	}
	return port, nil
}

// start runs redis-server on port and waits for PONG; on failure the
// process is gone when it returns.
func (p *Process) start(ctx context.Context, port int) error {
	logFile := filepath.Join(p.dir, "redis.log")
	args := append([]string{
		"--bind", "127.0.0.1",
		"--port", strconv.Itoa(port),
		"--dir", p.dir,
		"--save", "",
		"--appendonly", "no",
		"--daemonize", "no",
		"--protected-mode", "no",
		"--logfile", logFile,
		// A replica's full sync starts at once, not after 5 s (Redis 7's
		// default), so tests with replicas wait on nothing.
		"--repl-diskless-sync-delay", "0",
	}, p.extra...)
	cmd := exec.Command(p.binary, args...) // #nosec G204 -- test support runs the configured redis-server
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("run %s: %w", p.binary, err)
	}
	exited := make(chan struct{})
	p.mu.Lock()
	p.port, p.cmd, p.exited, p.waitErr = port, cmd, exited, nil
	p.mu.Unlock()
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.waitErr = err
		p.mu.Unlock()
		close(exited)
	}()

	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	if err := waitPong(ctx, p.Addr(), exited); err != nil {
		p.Stop()
		return fmt.Errorf("redis-server on port %d: %w (log: %s)", port, err, tail(logFile))
	}
	return nil
}

// waitPong polls addr with PING until PONG, the process exits or ctx ends.
func waitPong(ctx context.Context, addr string, exited <-chan struct{}) error {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		if last = ping(ctx, addr); last == nil {
			return nil
		}
		select {
		case <-exited:
			return errors.New("exited before answering PING")
		case <-ctx.Done():
			return fmt.Errorf("no PONG: %w (last: %w)", ctx.Err(), last)
		case <-tick.C:
		}
	}
}

// ping sends one inline PING over a fresh connection and expects +PONG.
func ping(ctx context.Context, addr string) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		if err := c.SetDeadline(dl); err != nil {
			return err
		}
	}
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if strings.TrimSpace(line) != "+PONG" {
		return fmt.Errorf("PING answered %q", strings.TrimSpace(line))
	}
	return nil
}

// tail returns the last lines of the redis log for error messages.
func tail(path string) string {
	b, err := os.ReadFile(path) // #nosec G304 -- our own log file
	if err != nil {
		return "unreadable: " + err.Error()
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 5 {
		lines = lines[len(lines)-5:]
	}
	return strings.Join(lines, " | ")
}

// Port returns the server's TCP port.
func (p *Process) Port() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.port
}

// Signal sends sig to the process (SIGSTOP and SIGCONT freeze and thaw
// it: its connections stay open but it answers nothing).
func (p *Process) Signal(sig syscall.Signal) error {
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	if cmd == nil {
		return errors.New("redistest: process not started")
	}
	return cmd.Process.Signal(sig)
}

// Kill ends the process with SIGKILL at once (a crash) and returns once
// it has been reaped; Stop afterwards does nothing.
func (p *Process) Kill() {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-exited
}

// Addr returns host:port of the server, e.g. "127.0.0.1:41234".
func (p *Process) Addr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port))
}

// URL returns the server as a redis:// URL with database 0.
func (p *Process) URL() string { return "redis://" + p.Addr() + "/0" }

// Stop ends the process: SIGTERM to its process group, then SIGKILL after
// 5 s. It is idempotent and returns once the process has been reaped.
func (p *Process) Stop() {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-exited:
		return
	default:
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
	t := time.NewTimer(stopTimeout)
	defer t.Stop()
	select {
	case <-exited:
	case <-t.C:
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
	}
}

// Restart stops the process and starts a fresh one on the same port: every
// key is gone afterwards (there is no persistence), as after a Redis crash.
// Clients reconnect on their next command.
func (p *Process) Restart(ctx context.Context) error {
	p.Stop()
	return p.Rerun(ctx)
}

// Rerun starts a fresh, empty server on the port of a stopped one (after
// Stop: Redis was down meanwhile, and comes back without its data). It
// returns once the server answers PING.
func (p *Process) Rerun(ctx context.Context) error {
	p.mu.Lock()
	port := p.port
	p.mu.Unlock()
	if err := p.start(ctx, port); err != nil {
		return fmt.Errorf("restart redis-server: %w", err)
	}
	return nil
}

// Server is a redis-server owned by one test; it is stopped in the test's
// Cleanup. Its methods are safe for concurrent use.
type Server struct {
	*Process
	tb testing.TB
}

// Start runs a redis-server for tb and stops it when tb ends. When the
// binary is missing it fails tb (skips it under -short) with the package
// and the command that installs it.
func Start(tb testing.TB) *Server {
	tb.Helper()
	if bin := Binary(); bin == DefaultBinary {
		testdeps.Need(tb, DefaultBinary)
	} else if _, err := os.Stat(bin); err != nil {
		tb.Fatalf("redistest: GPUBROKER_TEST_REDIS_SERVER=%s: %v", bin, err)
	}
	p, err := StartProcess(tb.Context(), tb.TempDir())
	if err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	tb.Cleanup(p.Stop)
	return &Server{Process: p, tb: tb}
}

// Restart is Process.Restart that fails the server's test on error.
func (s *Server) Restart() {
	s.tb.Helper()
	if err := s.Process.Restart(s.tb.Context()); err != nil {
		s.tb.Fatalf("redistest: %v", err)
	}
}

// Client returns a new client of the server with ContextTimeoutEnabled and
// PoolSize 64; it is closed in tb's Cleanup.
func (s *Server) Client(tb testing.TB) *redis.Client {
	tb.Helper()
	c := redis.NewClient(&redis.Options{
		Addr:                  s.Addr(),
		ContextTimeoutEnabled: true,
		PoolSize:              64,
	})
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

var prefixSeq atomic.Int64

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9_-]+`)

// Prefix returns a key prefix unique within the process for tb, such as
// "t7:TestPlace_binpack:". It contains no glob or hash-tag characters.
func (s *Server) Prefix(tb testing.TB) string {
	return Prefix(tb)
}

// Prefix returns a key prefix unique within the process for tb; see
// Server.Prefix.
func Prefix(tb testing.TB) string {
	name := unsafeChars.ReplaceAllString(tb.Name(), "_")
	if len(name) > 40 {
		name = name[len(name)-40:]
	}
	return fmt.Sprintf("t%d:%s:", prefixSeq.Add(1), name)
}
