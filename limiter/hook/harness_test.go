package hook_test

import (
	"bufio"
	"context"
	"encoding/json"
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

	"go.uber.org/goleak"

	"github.com/gpubroker/gpubroker/e2e/testdeps"
)

// CUresult values the tests compare against.
const (
	cudaSuccess      = 0
	cudaInvalidValue = 1
	cudaOutOfMemory  = 2
)

const mib = 1 << 20

var (
	buildOnce sync.Once
	buildErr  error
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// hookDir is this package's directory, where the Makefile lives.
func hookDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(file)
}

func buildDir() string { return filepath.Join(hookDir(), "build") }

// needBuild builds the C artifacts once per test binary (make is a no-op when
// they are up to date). Without gcc, the C headers or make it fails, naming
// the package to install (skips under -short).
func needBuild(t testing.TB) {
	t.Helper()
	for _, tool := range []string{"gcc", "/usr/include/stdio.h", "make"} {
		testdeps.Need(t, tool)
	}
	buildOnce.Do(func() {
		out, err := exec.Command("make", "-C", hookDir(), "-j2").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("make: %w\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
}

// slice describes one slice's hook configuration: the pod env.
type slice struct {
	MemoryMiB           uint64 // GPUBROKER_MEMORY_LIMIT_MIB; 0 = unset
	ComputePercent      int    // GPUBROKER_COMPUTE_PERCENT; 0 = unset
	ComputeLimitPercent int    // GPUBROKER_COMPUTE_LIMIT_PERCENT; 0 = unset
}

// device is one simulated GPU (one stub state file) shared by the processes a test starts.
type device struct {
	t     testing.TB
	dir   string
	state string
	extra []string // additional env for every process, e.g. stub settings
}

func newDevice(t testing.TB, extra ...string) *device {
	t.Helper()
	needBuild(t)
	dir := t.TempDir()
	return &device{t: t, dir: dir, state: filepath.Join(dir, "stub.state"), extra: extra}
}

// sliceFiles are one slice's quota and usage files.
type sliceFiles struct {
	Quota, Usage string
}

// newSlice returns fresh quota and usage paths (the files do not exist yet).
func (d *device) newSlice(name string) sliceFiles {
	dir := filepath.Join(d.dir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		d.t.Fatal(err)
	}
	return sliceFiles{Quota: filepath.Join(dir, "quota.bin"), Usage: filepath.Join(dir, "usage.bin")}
}

// env builds the environment of a hooked process of slice s.
func (d *device) env(f sliceFiles, s slice, hooked bool) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GPUBROKER_") && !strings.HasPrefix(kv, "LD_PRELOAD=") && !strings.HasPrefix(kv, "LD_LIBRARY_PATH=") {
			env = append(env, kv)
		}
	}
	env = append(env,
		"LD_LIBRARY_PATH="+filepath.Join(buildDir(), "stub"),
		"GPUBROKER_STUB_STATE="+d.state,
		"GPUBROKER_QUOTA_FILE="+f.Quota,
		"GPUBROKER_USAGE_FILE="+f.Usage,
		"GPUBROKER_SLICE_ID=test-slice",
	)
	if hooked {
		env = append(env, "LD_PRELOAD="+filepath.Join(buildDir(), "libgpulimit.so"))
	}
	if s.MemoryMiB != 0 {
		env = append(env, fmt.Sprintf("GPUBROKER_MEMORY_LIMIT_MIB=%d", s.MemoryMiB))
	}
	if s.ComputePercent != 0 {
		env = append(env, fmt.Sprintf("GPUBROKER_COMPUTE_PERCENT=%d", s.ComputePercent))
	}
	if s.ComputeLimitPercent != 0 {
		env = append(env, fmt.Sprintf("GPUBROKER_COMPUTE_LIMIT_PERCENT=%d", s.ComputeLimitPercent))
	}
	return append(env, d.extra...)
}

// reply is one line of cudaprog output: command, CUresult, values.
type reply struct {
	Cmd  string
	Res  int
	Vals []uint64
}

func parseReply(line string) (reply, error) {
	f := strings.Fields(line)
	if len(f) < 2 {
		return reply{}, fmt.Errorf("short reply %q", line)
	}
	res, err := strconv.Atoi(f[1])
	if err != nil {
		return reply{}, fmt.Errorf("reply %q: %w", line, err)
	}
	r := reply{Cmd: f[0], Res: res}
	for _, v := range f[2:] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return reply{}, fmt.Errorf("reply %q: %w", line, err)
		}
		r.Vals = append(r.Vals, n)
	}
	return r, nil
}

// run runs cudaprog with the commands (joined with ",") and returns its
// replies and stderr. It fails the test if the program fails or hangs.
func (d *device) run(f sliceFiles, s slice, procAddr bool, cmds ...string) ([]reply, string) {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(d.t.Context(), 60*time.Second)
	defer cancel()
	args := []string{}
	if procAddr {
		args = append(args, "-p")
	}
	for i, c := range cmds {
		if i > 0 {
			args = append(args, ",")
		}
		args = append(args, strings.Fields(c)...)
	}
	cmd := exec.CommandContext(ctx, filepath.Join(buildDir(), "cudaprog"), args...)
	cmd.Env = d.env(f, s, true)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		d.t.Fatalf("cudaprog %v: %v\nstdout:\n%s\nstderr:\n%s", args, err, out, stderr.String())
	}
	var replies []reply
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		r, err := parseReply(line)
		if err != nil {
			d.t.Fatal(err)
		}
		replies = append(replies, r)
	}
	if len(replies) != len(cmds) {
		d.t.Fatalf("cudaprog %v: %d replies for %d commands:\n%s", args, len(replies), len(cmds), out)
	}
	return replies, stderr.String()
}

// proc is an interactive cudaprog (-i): commands go to stdin, replies come from stdout.
type proc struct {
	t       testing.TB
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	lines   chan string
	stderr  *strings.Builder
	done    chan struct{}
	waitErr error
}

// start launches an interactive cudaprog with the hook; it is killed and reaped at cleanup.
func (d *device) start(f sliceFiles, s slice, args ...string) *proc {
	d.t.Helper()
	return d.startProc(true, f, s, args...)
}

// startBare launches an interactive cudaprog on the stub without the hook.
func (d *device) startBare(args ...string) *proc {
	d.t.Helper()
	return d.startProc(false, sliceFiles{}, slice{}, args...)
}

func (d *device) startProc(hooked bool, f sliceFiles, s slice, args ...string) *proc {
	d.t.Helper()
	cmd := exec.Command(filepath.Join(buildDir(), "cudaprog"), append([]string{"-i"}, args...)...)
	cmd.Env = d.env(f, s, hooked)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		d.t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		d.t.Fatal(err)
	}
	p := &proc{t: d.t, cmd: cmd, stdin: stdin, lines: make(chan string, 64), stderr: &strings.Builder{}, done: make(chan struct{})}
	cmd.Stderr = &lockedWriter{b: p.stderr}
	if err := cmd.Start(); err != nil {
		d.t.Fatal(err)
	}
	go func() {
		defer close(p.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
	}()
	go func() {
		p.waitErr = cmd.Wait()
		close(p.done)
	}()
	d.t.Cleanup(func() { p.kill() })
	return p
}

type lockedWriter struct {
	mu sync.Mutex
	b  *strings.Builder
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// pid is the process id of p.
func (p *proc) pid() int { return p.cmd.Process.Pid }

// next waits for the next reply line, failing after timeout.
func (p *proc) next(timeout time.Duration) reply {
	p.t.Helper()
	select {
	case line, ok := <-p.lines:
		if !ok {
			p.t.Fatalf("cudaprog %d exited early; stderr:\n%s", p.pid(), p.stderr.String())
		}
		r, err := parseReply(line)
		if err != nil {
			p.t.Fatal(err)
		}
		return r
	case <-time.After(timeout):
		p.t.Fatalf("cudaprog %d: no reply within %v (hang?)", p.pid(), timeout)
	}
	return reply{}
}

// do sends one command and waits for its reply.
func (p *proc) do(command string) reply {
	p.t.Helper()
	if _, err := io.WriteString(p.stdin, command+"\n"); err != nil {
		p.t.Fatalf("send %q: %v", command, err)
	}
	return p.next(30 * time.Second)
}

// kill sends SIGKILL and waits until the process is reaped.
func (p *proc) kill() {
	_ = p.cmd.Process.Kill() // already exited is fine
	<-p.done
	_ = p.stdin.Close()
	for range p.lines { // drain so the reader goroutine ends
	}
}

// stubState is stubctl's JSON view of the simulated device.
type stubState struct {
	UUID       string `json:"uuid"`
	TotalBytes uint64 `json:"total_bytes"`
	UsedBytes  uint64 `json:"used_bytes"`
	SMCount    uint64 `json:"sm_count"`
	NowNs      uint64 `json:"now_ns"`
	SMNsTotal  uint64 `json:"sm_ns_total"`
	Counters   struct {
		Alloc       uint64 `json:"alloc"`
		Free        uint64 `json:"free"`
		FreeUnknown uint64 `json:"free_unknown"`
		OOM         uint64 `json:"oom"`
		Launch      uint64 `json:"launch"`
		Reaped      uint64 `json:"reaped"`
		Trim        uint64 `json:"trim"`
	} `json:"counters"`
	Procs []struct {
		PID      int    `json:"pid"`
		MemBytes uint64 `json:"mem_bytes"`
		SMNs     uint64 `json:"sm_ns"`
		Launches uint64 `json:"launches"`
	} `json:"procs"`
}

// stub reads the device state through stubctl, failing the test on error.
func (d *device) stub() stubState {
	d.t.Helper()
	s, err := d.readStub()
	if err != nil {
		d.t.Fatal(err)
	}
	return s
}

// readStub reads the device state through stubctl; safe from any goroutine.
func (d *device) readStub() (stubState, error) {
	cmd := exec.Command(filepath.Join(buildDir(), "stubctl"))
	cmd.Env = append(os.Environ(), "GPUBROKER_STUB_STATE="+d.state)
	out, err := cmd.Output()
	if err != nil {
		return stubState{}, fmt.Errorf("stubctl: %w", err)
	}
	var s stubState
	if err := json.Unmarshal(out, &s); err != nil {
		return stubState{}, fmt.Errorf("stubctl output %q: %w", out, err)
	}
	return s, nil
}

// procMem returns the device memory the stub charges to pid.
func (s stubState) procMem(pid int) uint64 {
	for _, p := range s.Procs {
		if p.PID == pid {
			return p.MemBytes
		}
	}
	return 0
}

// procSMNs returns the SM-nanoseconds the stub charged to pid.
func (s stubState) procSMNs(pid int) uint64 {
	for _, p := range s.Procs {
		if p.PID == pid {
			return p.SMNs
		}
	}
	return 0
}
