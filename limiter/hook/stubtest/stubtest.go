// Package stubtest is the test support for running programs on the stub
// driver from Go tests outside limiter/hook: it builds the C artifacts
// (limiter/hook/build, by the limiter's Makefile, as `go tool task
// limiter:build` does), starts the interactive test program
// limiter/hook/build/cudaprog, plain or under the hook in a slice, talks to
// it one line command at a time, and polls conditions with a deadline.
//
// The hook is the production libgpulimit.so: it reads its slice only from
// the fixed in-pod paths, so StartInSlice runs the program under
// limiter/hook/build/podrun, which mounts the slice's host directories there
// in a private mount namespace (as root, or in an unprivileged user
// namespace), read-only for the quota, and drops every capability.
//
// Tests that use it need gcc, libc6-dev and make; without them Need fails
// the test naming the packages (skips it under -short); StartInSlice does the
// same when podrun cannot set up its namespace (root or unprivileged user
// namespaces are needed). Every process Start and StartInSlice start is
// killed and waited for in the test's cleanup.
//
// limiter/hook's own tests keep their internal harness (harness_test.go);
// this package is for the node agent's and the broker's end-to-end tests.
package stubtest

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpubroker/gpubroker/e2e/testdeps"
)

// DeviceUUID is the stub device's GPU UUID (limiter/hook/stub/device.c).
const DeviceUUID = "GPU-5bd3a1e2-7c4f-4e8a-9b1d-2f6e8c0a4d17"

// EventuallyWithin is how long Eventually waits for its condition, and
// EventuallyPoll how often it tests it.
const (
	EventuallyWithin = 20 * time.Second
	EventuallyPoll   = 2 * time.Millisecond
)

var (
	buildOnce sync.Once
	buildErr  error
)

// BuildDir is limiter/hook/build, where `make -C limiter/hook` puts the stub
// driver (stub/), the hook (libgpulimit.so), cudaprog and stubctl. It is
// found relative to this package's source.
func BuildDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "build")
}

// StubDir is the stub driver's directory (libcuda.so.1, libnvidia-ml.so.1),
// for LD_LIBRARY_PATH.
func StubDir() string { return filepath.Join(BuildDir(), "stub") }

// HookLibrary is the hook, libgpulimit.so (the production build), for LD_PRELOAD.
func HookLibrary() string { return filepath.Join(BuildDir(), "libgpulimit.so") }

// Environ is this process's environment without the GPUBROKER_ and LD_
// variables: the base a test adds the stub's and the hook's settings to.
func Environ() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GPUBROKER_") && !strings.HasPrefix(kv, "LD_") {
			env = append(env, kv)
		}
	}
	return env
}

// Need builds the C artifacts once per test binary (make is a no-op when
// they are up to date) and fails tb if that fails. Without gcc or make it
// fails tb naming the package to install (skips it under -short).
func Need(tb testing.TB) {
	tb.Helper()
	for _, tool := range []string{"gcc", "/usr/include/stdio.h", "make"} {
		testdeps.Need(tb, tool)
	}
	buildOnce.Do(func() {
		if out, err := exec.Command("make", "-C", filepath.Join(BuildDir(), ".."), "-j2").CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("make: %w\n%s", err, out)
		}
	})
	if buildErr != nil {
		tb.Fatal(buildErr)
	}
}

// Prog is an interactive cudaprog (-i): it reads one command a line on
// stdin and answers each with one line, "command CUresult values...".
type Prog struct {
	tb      testing.TB
	cmd     *exec.Cmd
	in      io.WriteCloser
	out     *bufio.Scanner
	stderr  lockedBuilder
	exited  chan struct{} // closed when the process has been waited for
	waitErr error         // valid after exited is closed
}

// Start starts cudaprog -i, without the hook, with exactly env as its
// environment (add LD_LIBRARY_PATH=StubDir() for the stub driver). It fails
// tb if the program cannot start; tb's cleanup closes its stdin, kills it and
// waits for it.
func Start(tb testing.TB, env []string) *Prog {
	tb.Helper()
	return start(tb, exec.Command(filepath.Join(BuildDir(), "cudaprog"), "-i"), env)
}

var (
	podrunOnce sync.Once
	podrunErr  error
)

// StartInSlice starts cudaprog -i under the hook (LD_PRELOAD=HookLibrary(),
// added to env) as a process of the slice whose host directories are
// quotaDir and usageDir (<host root>/slices/<id>/quota and .../usage, laid
// out as the node agent lays them out; both must exist), mounted at the
// fixed in-pod paths by podrun. Its pid is the program's. Otherwise as Start.
func StartInSlice(tb testing.TB, env []string, quotaDir, usageDir string) *Prog {
	tb.Helper()
	podrun := filepath.Join(BuildDir(), "podrun")
	podrunOnce.Do(func() {
		if out, err := exec.Command(podrun, "/bin/true").CombinedOutput(); err != nil {
			podrunErr = fmt.Errorf("podrun cannot set up a mount namespace (root or unprivileged user namespaces needed): %w\n%s", err, out)
		}
	})
	if podrunErr != nil {
		if testing.Short() {
			tb.Skip(podrunErr)
		}
		tb.Fatal(podrunErr)
	}
	cmd := exec.Command(podrun, "-q", quotaDir, "-u", usageDir, filepath.Join(BuildDir(), "cudaprog"), "-i")
	return start(tb, cmd, append(append([]string{}, env...), "LD_PRELOAD="+HookLibrary()))
}

func start(tb testing.TB, cmd *exec.Cmd, env []string) *Prog {
	tb.Helper()
	cmd.Env = env
	p := &Prog{tb: tb, cmd: cmd, exited: make(chan struct{})}
	cmd.Stderr = &p.stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	p.in, p.out = in, bufio.NewScanner(out)
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	tb.Cleanup(func() {
		_ = p.in.Close()
		_ = cmd.Process.Kill()
		<-p.exited
	})
	return p
}

// Do sends one command and returns its reply's CUresult and values. It
// fails the test, with the program's stderr, when the program does not
// answer or the reply does not parse.
func (p *Prog) Do(command string) (int, []uint64) {
	p.tb.Helper()
	return p.Send(command)()
}

// Send sends one command without waiting for its reply, so that several
// programs can work at once (a long "saturate" each); the function it
// returns waits for the reply and returns it as Do does. Call both from
// the test's goroutine, and the reply function exactly once before the
// next command.
func (p *Prog) Send(command string) func() (int, []uint64) {
	p.tb.Helper()
	if _, err := io.WriteString(p.in, command+"\n"); err != nil {
		p.tb.Fatalf("cudaprog %q: %v; stderr: %s", command, err, p.stderr.String())
	}
	return func() (int, []uint64) {
		p.tb.Helper()
		return p.reply(command)
	}
}

// reply reads the reply to command.
func (p *Prog) reply(command string) (int, []uint64) {
	p.tb.Helper()
	if !p.out.Scan() {
		p.tb.Fatalf("cudaprog %q: no reply (%v); stderr: %s", command, p.out.Err(), p.stderr.String())
	}
	f := strings.Fields(p.out.Text())
	if len(f) < 2 {
		p.tb.Fatalf("cudaprog %q: reply %q", command, p.out.Text())
	}
	res, err := strconv.Atoi(f[1])
	if err != nil {
		p.tb.Fatal(err)
	}
	var vals []uint64
	for _, v := range f[2:] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			p.tb.Fatal(err)
		}
		vals = append(vals, n)
	}
	return res, vals
}

// Pid is the program's process id.
func (p *Prog) Pid() int { return p.cmd.Process.Pid }

// Exited is closed once the program has exited and been waited for.
func (p *Prog) Exited() <-chan struct{} { return p.exited }

// WaitErr is how the program ended (exec.Cmd.Wait's error); valid once
// Exited is closed.
func (p *Prog) WaitErr() error {
	<-p.exited
	return p.waitErr
}

// Stderr is what the program has written to stderr so far.
func (p *Prog) Stderr() string { return p.stderr.String() }

// lockedBuilder is a strings.Builder safe to write from exec's copying
// goroutine while a test reads it.
type lockedBuilder struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuilder) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuilder) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Eventually tests cond every EventuallyPoll until it holds, and fails tb
// with what and cond's last explanation if it has not held within
// EventuallyWithin.
func Eventually(tb testing.TB, what string, cond func() (bool, string)) {
	tb.Helper()
	deadline := time.Now().Add(EventuallyWithin)
	last := ""
	for time.Now().Before(deadline) {
		ok, why := cond()
		if ok {
			return
		}
		last = why
		<-time.After(EventuallyPoll)
	}
	tb.Fatalf("%s: not within %g s; last: %s", what, EventuallyWithin.Seconds(), last)
}
