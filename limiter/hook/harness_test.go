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
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gpubroker/gpubroker/e2e/testdeps"
	"github.com/gpubroker/gpubroker/limiter/region"
)

// CUresult values the tests compare against.
const (
	cudaSuccess      = 0
	cudaInvalidValue = 1
	cudaOutOfMemory  = 2
	cudaNotPermitted = 800
	cudaNotSupported = 801
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

// slice is the quota the node agent writes first for a slice (generation 1),
// from its pod's annotations. The zero value writes no quota file.
type slice struct {
	MemoryMiB           uint64 // memory cap per device, MiB
	ComputePercent      int    // guaranteed SM share, 1..100; 0 with MemoryMiB 0: no file
	ComputeLimitPercent int    // burst ceiling; 0 = ComputePercent
}

// quota is s as a quota region value.
func (s slice) quota() region.Quota {
	lim := s.ComputeLimitPercent
	if lim == 0 {
		lim = s.ComputePercent
	}
	return region.Quota{SliceID: "test-slice", MemoryLimitBytes: s.MemoryMiB * mib,
		ComputePercent: uint32(s.ComputePercent), ComputeLimitPercent: uint32(lim)}
}

// device is one simulated GPU (one stub state file) shared by the processes a test starts.
type device struct {
	t     testing.TB
	dir   string
	state string
	extra []string // additional env for every process, e.g. stub settings

	mu      sync.Mutex
	procs   []*proc
	expired bool // within's deadline passed: every process was killed
}

// within gives the test a deadline: when it passes, every process of the
// device is killed, so whatever the test waits for fails at once with the
// processes' stderr instead of hanging.
func (d *device) within(limit time.Duration) {
	timer := time.AfterFunc(limit, func() {
		d.mu.Lock()
		d.expired = true
		procs := slices.Clone(d.procs)
		d.mu.Unlock()
		for _, p := range procs {
			_ = p.cmd.Process.Kill()
		}
	})
	d.t.Cleanup(func() {
		timer.Stop()
		d.mu.Lock()
		defer d.mu.Unlock()
		if d.expired {
			d.t.Errorf("the test passed its %v deadline: its processes were killed", limit)
		}
	})
}

func newDevice(t testing.TB, extra ...string) *device {
	t.Helper()
	needBuild(t)
	needPodrun(t)
	dir := t.TempDir()
	return &device{t: t, dir: dir, state: filepath.Join(dir, "stub.state"), extra: extra}
}

// sliceFiles are one slice's directories and files on the host, laid out as
// the node agent lays them out (<slice>/quota, <slice>/usage, both 0755; the
// usage file initialized at 0666). podrun mounts the two directories at the
// fixed in-pod paths, the quota one read-only.
type sliceFiles struct {
	QuotaDir, UsageDir string
	Quota, Usage       string
}

// newSlice lays out a fresh slice directory with its usage file and no quota file.
func (d *device) newSlice(name string) sliceFiles {
	d.t.Helper()
	dir := filepath.Join(d.dir, name)
	f := sliceFiles{QuotaDir: filepath.Join(dir, "quota"), UsageDir: filepath.Join(dir, "usage")}
	f.Quota, f.Usage = filepath.Join(f.QuotaDir, "quota.bin"), filepath.Join(f.UsageDir, "usage.bin")
	for _, sub := range []string{dir, f.QuotaDir, f.UsageDir} {
		if err := os.MkdirAll(sub, 0o755); err != nil {
			d.t.Fatal(err)
		}
		if err := os.Chmod(sub, 0o755); err != nil {
			d.t.Fatal(err)
		}
	}
	if err := region.CreateUsage(f.Usage); err != nil {
		d.t.Fatal(err)
	}
	return f
}

// initialQuota writes s as the slice's first quota file unless one exists.
func (d *device) initialQuota(f sliceFiles, s slice) {
	d.t.Helper()
	if s == (slice{}) {
		return
	}
	if _, err := os.Lstat(f.Quota); err == nil {
		return
	}
	if err := region.WriteQuota(f.Quota, s.quota()); err != nil {
		d.t.Fatal(err)
	}
}

// env builds the environment of a process: the stub driver, and the hook if hooked.
func (d *device) env(hooked bool, extra []string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GPUBROKER_") && !strings.HasPrefix(kv, "LD_PRELOAD=") && !strings.HasPrefix(kv, "LD_LIBRARY_PATH=") {
			env = append(env, kv)
		}
	}
	env = append(env,
		"LD_LIBRARY_PATH="+filepath.Join(buildDir(), "stub"),
		"GPUBROKER_STUB_STATE="+d.state,
	)
	if hooked {
		env = append(env, "LD_PRELOAD="+filepath.Join(buildDir(), "libgpulimit.so"))
	}
	env = append(env, d.extra...)
	return append(env, extra...)
}

// procOpts are the less common ways to start a process.
type procOpts struct {
	env []string // more environment, after the harness's (the tenant's own variables)
	uid int      // > 0: run as this uid (a tenant that is not root); needs root
	// before is a shell script the tenant runs inside the pod's mounts
	// just before the program, in the same mount namespace (so changes to
	// the pod's own paths are seen by the program).
	before string
}

// command builds the command line of cudaprog for slice f: under podrun
// (the slice mounted at the fixed paths, no capabilities) when hooked.
func (d *device) command(ctx context.Context, hooked bool, f sliceFiles, o procOpts, args ...string) *exec.Cmd {
	prog := filepath.Join(buildDir(), "cudaprog")
	var cmd *exec.Cmd
	if hooked {
		pr := []string{"-q", f.QuotaDir, "-u", f.UsageDir}
		if o.uid > 0 {
			d.shareWith(o.uid)
			pr = append(pr, "-U", fmt.Sprint(o.uid))
		}
		if o.before != "" {
			pr = append(pr, "/bin/sh", "-c", o.before+"\nexec \"$0\" \"$@\"")
		}
		cmd = exec.CommandContext(ctx, filepath.Join(buildDir(), "podrun"), append(append(pr, prog), args...)...)
	} else {
		cmd = exec.CommandContext(ctx, prog, args...)
	}
	cmd.Env = d.env(hooked, o.env)
	return cmd
}

// shareWith lets uid reach the device's files: the test directories are
// root's and 0700 by default.
func (d *device) shareWith(uid int) {
	d.t.Helper()
	for dir := d.dir; dir != "/" && dir != os.TempDir(); dir = filepath.Dir(dir) {
		if err := os.Chmod(dir, 0o755); err != nil {
			d.t.Fatal(err)
		}
	}
	if _, err := os.Stat(d.state); err != nil {
		if err := os.WriteFile(d.state, nil, 0o666); err != nil {
			d.t.Fatal(err)
		}
	}
	if err := os.Chmod(d.state, 0o666); err != nil {
		d.t.Fatal(err)
	}
}

var (
	podrunOnce sync.Once
	podrunErr  error
)

// needPodrun checks once that podrun can set up a mount namespace here (root,
// or unprivileged user namespaces). Without it the hook tests fail, saying
// so (they skip under -short).
func needPodrun(t testing.TB) {
	t.Helper()
	podrunOnce.Do(func() {
		out, err := exec.Command(filepath.Join(buildDir(), "podrun"), "/bin/true").CombinedOutput()
		if err != nil {
			podrunErr = fmt.Errorf("podrun cannot set up a mount namespace (root or unprivileged user namespaces needed): %w\n%s", err, out)
		}
	})
	if podrunErr != nil {
		if testing.Short() {
			t.Skip(podrunErr)
		}
		t.Fatal(podrunErr)
	}
}

// needRoot fails (skips under -short) a test that runs processes as another
// uid: that needs root (CI runs as root).
func needRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		if testing.Short() {
			t.Skip("running a tenant as another uid needs root")
		}
		t.Fatal("running a tenant as another uid needs root (CI runs as root)")
	}
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

// run runs cudaprog under the hook in slice f (writing s as its first quota
// unless one exists) with the commands (joined with ",") and returns its
// replies and stderr. It fails the test if the program fails or hangs.
func (d *device) run(f sliceFiles, s slice, procAddr bool, cmds ...string) ([]reply, string) {
	d.t.Helper()
	d.initialQuota(f, s)
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
	cmd := d.command(ctx, true, f, procOpts{}, args...)
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
	errw    *lockedWriter
	done    chan struct{}
	waitErr error
}

// errText is what the process wrote to stderr so far; safe while it runs.
func (p *proc) errText() string {
	p.errw.mu.Lock()
	defer p.errw.mu.Unlock()
	return p.stderr.String()
}

// start launches an interactive cudaprog with the hook in slice f, writing s
// as the slice's first quota unless one exists (as the node agent does when
// it sees the pod); it is killed and reaped at cleanup.
func (d *device) start(f sliceFiles, s slice, args ...string) *proc {
	d.t.Helper()
	d.initialQuota(f, s)
	return d.startProc(true, f, procOpts{}, args...)
}

// startBare launches an interactive cudaprog on the stub without the hook.
func (d *device) startBare(args ...string) *proc {
	d.t.Helper()
	return d.startProc(false, sliceFiles{}, procOpts{}, args...)
}

// startAs launches an interactive cudaprog with the hook in slice f the way o
// says (more environment, another uid), without writing a quota.
func (d *device) startAs(f sliceFiles, o procOpts, args ...string) *proc {
	d.t.Helper()
	return d.startProc(true, f, o, args...)
}

// tenant runs a shell script as the notebook user would, inside the pod's
// mounts (podrun, no capabilities; uid 0 unless uid > 0), and returns its
// combined output and error. Scripts must touch only the pod's paths
// (/var/run/gpubroker) and the test's own directories: the rest of the
// filesystem is the host's.
func (d *device) tenant(f sliceFiles, uid int, script string) (string, error) {
	d.t.Helper()
	args := []string{"-q", f.QuotaDir, "-u", f.UsageDir}
	if uid > 0 {
		d.shareWith(uid)
		args = append(args, "-U", fmt.Sprint(uid))
	}
	ctx, cancel := context.WithTimeout(d.t.Context(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(buildDir(), "podrun"), append(args, "/bin/sh", "-c", script)...)
	cmd.Env = d.env(true, nil)
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		d.t.Fatalf("tenant script did not finish within 30 s: %s\n%s", script, out)
	}
	return string(out), err
}

func (d *device) startProc(hooked bool, f sliceFiles, o procOpts, args ...string) *proc {
	d.t.Helper()
	cmd := d.command(context.Background(), hooked, f, o, append([]string{"-i"}, args...)...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		d.t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		d.t.Fatal(err)
	}
	p := &proc{t: d.t, cmd: cmd, stdin: stdin, lines: make(chan string, 64), stderr: &strings.Builder{}, done: make(chan struct{})}
	p.errw = &lockedWriter{b: p.stderr}
	cmd.Stderr = p.errw
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
	d.mu.Lock()
	d.procs = append(d.procs, p)
	d.mu.Unlock()
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
		StallNs  uint64 `json:"stall_ns"` // gaps between its launches beyond 10 ms, summed
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

// askingShare is pid's share of the device's SM time from a to b, in
// percent, over the time it was asking: the span less its stalls (gaps
// between its launches beyond 10 ms, GPUBROKER_STUB_STALL_MS). A process
// that launches back to back and is descheduled or stopped asks for nothing
// meanwhile; the limiter's token bucket makes up gaps of up to its 10 ms
// depth, so what is left is the limiter's doing. A pacer that bursts after
// a stall shows as a share above the target.
func askingShare(a, b stubState, pid int) float64 {
	span := float64(b.NowNs-a.NowNs) - float64(b.procStallNs(pid)-a.procStallNs(pid))
	if span <= 0 {
		return 0
	}
	return float64(b.procSMNs(pid)-a.procSMNs(pid)) / (span * float64(b.SMCount)) * 100
}

// procStallNs returns the stall time the stub counted for pid.
func (s stubState) procStallNs(pid int) uint64 {
	for _, p := range s.Procs {
		if p.PID == pid {
			return p.StallNs
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
