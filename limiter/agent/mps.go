package agent

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

// MPS: the agent runs one NVIDIA MPS control daemon per GPU in MPS mode
// and gives every MPS client of that GPU its limits through the daemon.
//
// What MPS lets a client change, and so what gpubroker sets where (NVIDIA's
// MPS documentation, "Tools and Interface Reference" and "Environment
// Variables"):
//   - The control daemon's set_default_active_thread_percentage and
//     set_default_device_pinned_mem_limit apply to every MPS server it
//     starts afterwards (one server per client uid), and through the server
//     to each of its clients. A client's own CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
//     "will only further constrain the limit set by the control daemon"; the
//     same holds for CUDA_MPS_PINNED_DEVICE_MEM_LIMIT against the daemon's
//     pinned limit. A client can lower its limits, never raise them.
//   - The limits are per client process, fixed when its CUDA context is
//     created: a live change is not possible (NVIDIA: the percentage of a
//     running process cannot be edited), so MPS servers are not resizable.
//   - Limits are per server, not per client: the MPS clients of one GPU
//     that share a server (same uid, as notebook images' users are) all get
//     the daemon's values. So the broker places on one GPU only MPS clients
//     of one size (redisstore, "shape"), and the agent sets the daemon's
//     defaults to that size: the ceiling is each tenant's own limit, and
//     nothing in a tenant's environment widens it. No variable in the pod
//     carries a limit; the pod mounts the pipe directory read-only at the
//     clients' default path (v1.PodMPSPipeDir).
//   - The pinned limit is per process: two processes of one tenant may hold
//     it twice. The in-pod hook still caps the slice's memory over all of
//     its processes (its quota file holds the slice's memory, compute
//     unpaced), and the agent's NVML view stops what passes both.
//   - A GPU in MPS mode runs in EXCLUSIVE_PROCESS compute mode (set here
//     through NVML where the library has nvmlDeviceSetComputeMode), so a
//     process that avoids MPS (another pipe directory) cannot get a context
//     next to the MPS server.
//
// Daemon directories: <host root>/mps/<gpu uuid>/pipe and .../log, and the
// node's MPS shared memory <host root>/mps/shm, which is the daemon's and
// the clients' /dev/shm (the agent's DaemonSet mounts it there).

// MPS defaults of Config.
const (
	// DefaultMPSControl is the control program, found on PATH.
	DefaultMPSControl = "nvidia-cuda-mps-control"
	// DefaultMPSRestartDelay is the wait before restarting a daemon that died.
	DefaultMPSRestartDelay = 2 * time.Second
	// mpsReadyTimeout bounds the wait for a started daemon to answer.
	mpsReadyTimeout = 15 * time.Second
	// mpsQuitTimeout bounds the wait for a daemon told to quit.
	mpsQuitTimeout = 10 * time.Second
	// mpsIdlePercent and mpsIdleMiB are the limits of a daemon with no
	// gpubroker client on its GPU yet: a process that connects before the
	// agent knows the size gets next to nothing.
	mpsIdlePercent = 1
	mpsIdleMiB     = 1
)

// ModeSource tells the agent the sharing modes in force on its node's GPUs
// (implemented by agentstore.Store.Modes).
type ModeSource interface {
	Modes(ctx context.Context, node string) (map[string]v1.SharingMode, error)
}

// MPSDirs are the directories of one GPU's MPS control daemon.
type MPSDirs struct {
	Pipe, Log string
}

// MPSProcess is a running control daemon.
type MPSProcess interface {
	// Wait waits for it to exit.
	Wait() error
	// Kill kills it.
	Kill() error
	// PID is its process id.
	PID() int
}

// MPSLauncher runs nvidia-cuda-mps-control (ExecMPS) or, in tests, a
// stand-in.
type MPSLauncher interface {
	// Daemon starts gpu's control daemon in the foreground with dirs.
	Daemon(gpu string, dirs MPSDirs) (MPSProcess, error)
	// Control sends commands, one per line, to the daemon of dirs and
	// returns what it printed.
	Control(ctx context.Context, gpu string, dirs MPSDirs, commands ...string) (string, error)
}

// ExecMPS runs the control program at Path ("" = DefaultMPSControl on PATH).
type ExecMPS struct{ Path string }

var _ MPSLauncher = ExecMPS{}

func (e ExecMPS) path() string {
	if e.Path == "" {
		return DefaultMPSControl
	}
	return e.Path
}

func mpsEnv(gpu string, dirs MPSDirs) []string {
	return append(os.Environ(), "CUDA_VISIBLE_DEVICES="+gpu,
		"CUDA_MPS_PIPE_DIRECTORY="+dirs.Pipe, "CUDA_MPS_LOG_DIRECTORY="+dirs.Log)
}

// Daemon runs "<path> -f" with the GPU and directories in its environment.
func (e ExecMPS) Daemon(gpu string, dirs MPSDirs) (MPSProcess, error) {
	cmd := exec.Command(e.path(), "-f")
	cmd.Env = mpsEnv(gpu, dirs)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s -f: %w", e.path(), err)
	}
	return execProcess{cmd}, nil
}

// Control runs "<path>" with commands on its stdin.
func (e ExecMPS) Control(ctx context.Context, gpu string, dirs MPSDirs, commands ...string) (string, error) {
	cmd := exec.CommandContext(ctx, e.path())
	cmd.Env = mpsEnv(gpu, dirs)
	cmd.Stdin = strings.NewReader(strings.Join(commands, "\n") + "\n")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("%s <<< %q: %w: %s", e.path(), strings.Join(commands, "; "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

type execProcess struct{ cmd *exec.Cmd }

func (p execProcess) Wait() error { return p.cmd.Wait() }
func (p execProcess) Kill() error { return p.cmd.Process.Kill() }
func (p execProcess) PID() int    { return p.cmd.Process.Pid }

// mpsShape is the client size of an MPS GPU: every client's pinned memory
// limit (MiB) and active-thread percentage.
type mpsShape struct {
	MemoryMiB int64
	Percent   int
}

// commands are the control commands that set s as the daemon's defaults
// for the next server (device 0: the daemon sees only its GPU).
func (s mpsShape) commands() []string {
	return []string{
		fmt.Sprintf("set_default_active_thread_percentage %d", s.Percent),
		fmt.Sprintf("set_default_device_pinned_mem_limit 0 %dM", s.MemoryMiB),
	}
}

// MPSStatus is one supervised daemon as the agent sees it.
type MPSStatus struct {
	// Running is true while the daemon answers with the GPU's limits set.
	Running bool
	// PID is the daemon's process id; 0 when none runs.
	PID int
	// Restarts counts the times it died and was started again.
	Restarts int
	// Shape is the client size set on it.
	MemoryMiB int64
	Percent   int
}

// mpsSupervisor is one GPU's daemon supervision.
type mpsSupervisor struct {
	gpu    string
	dirs   MPSDirs
	shapes chan mpsShape // latest wanted size (capacity 1, replaced)
	cancel context.CancelFunc
	done   chan struct{}
}

// mpsState is the agent's set of supervisors. Guarded by mu.
type mpsState struct {
	mu     sync.Mutex
	sup    map[string]*mpsSupervisor
	status map[string]MPSStatus
	last   map[string]v1.SharingMode // the broker's last word on the modes
	kick   chan struct{}
}

func newMPSState() *mpsState {
	return &mpsState{sup: map[string]*mpsSupervisor{}, status: map[string]MPSStatus{}, last: map[string]v1.SharingMode{},
		kick: make(chan struct{}, 1)}
}

// MPS returns the status of the MPS daemon of every GPU the agent runs one
// for; safe for concurrent use.
func (a *Agent) MPS() map[string]MPSStatus {
	a.mpsState.mu.Lock()
	defer a.mpsState.mu.Unlock()
	out := make(map[string]MPSStatus, len(a.mpsState.status))
	for k, v := range a.mpsState.status {
		out[k] = v
	}
	return out
}

func (a *Agent) setMPSStatus(gpu string, f func(*MPSStatus)) {
	a.mpsState.mu.Lock()
	s := a.mpsState.status[gpu]
	f(&s)
	a.mpsState.status[gpu] = s
	a.mpsState.mu.Unlock()
	a.metrics.mpsUp.WithLabelValues(gpu).Set(boolGauge(s.Running))
}

// mpsLoop reconciles the MPS daemons with the GPUs' modes every heartbeat
// and whenever the slices change, until ctx ends; then it stops every
// daemon and returns.
func (a *Agent) mpsLoop(ctx context.Context) error {
	t := a.clock.NewTicker(a.cfg.HeartbeatInterval)
	defer t.Stop()
	defer a.stopAllMPS()
	for {
		a.reconcileMPS(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
		case <-a.mpsState.kick:
		}
	}
}

// kickMPS asks mpsLoop for a pass (the slices changed).
func (a *Agent) kickMPS() {
	select {
	case a.mpsState.kick <- struct{}{}:
	default:
	}
}

// wantedMPS returns the GPUs that need a daemon and their client size: the
// GPUs the broker says are in MPS mode, and those that hold an MPS slice
// (the broker placed it so). A GPU's size is its MPS slices'; if they
// disagree (they never should), the smallest of each limit. A GPU in MPS
// mode without slices gets the idle limits.
func (a *Agent) wantedMPS(modes map[string]v1.SharingMode) map[string]mpsShape {
	want := map[string]mpsShape{}
	local := map[string]bool{}
	for _, d := range a.devs.list {
		local[d.report.UUID] = d.parent == nil && !d.report.MIGEnabled
	}
	for gpu, m := range modes {
		if m == v1.SharingMPS && local[gpu] {
			want[gpu] = mpsShape{MemoryMiB: mpsIdleMiB, Percent: mpsIdlePercent}
		}
	}
	seen := map[string]bool{}
	for _, s := range a.pods.Slices() {
		if s.Sharing != v1.SharingMPS || !local[s.GPU] {
			continue
		}
		sh := mpsShape{MemoryMiB: s.Initial.MemoryMiB, Percent: s.Initial.ComputePercent}
		if cur, ok := want[s.GPU]; ok && seen[s.GPU] {
			sh = mpsShape{MemoryMiB: min(cur.MemoryMiB, sh.MemoryMiB), Percent: min(cur.Percent, sh.Percent)}
		}
		want[s.GPU], seen[s.GPU] = sh, true
	}
	return want
}

// reconcileMPS starts, updates and stops supervisors to match wantedMPS.
func (a *Agent) reconcileMPS(ctx context.Context) {
	if a.modes != nil {
		m, err := a.modes.Modes(ctx, a.cfg.Node)
		if err != nil && ctx.Err() == nil {
			a.metrics.errors.WithLabelValues("redis").Inc()
			a.log.WarnContext(ctx, "gpu modes not read; keeping the last ones", "err", err)
		}
		if err == nil && len(m) > 0 {
			a.mpsState.mu.Lock()
			a.mpsState.last = m
			a.mpsState.mu.Unlock()
		}
	}
	a.mpsState.mu.Lock()
	modes := a.mpsState.last
	a.mpsState.mu.Unlock()
	want := a.wantedMPS(modes)

	a.mpsState.mu.Lock()
	var stop []*mpsSupervisor
	for gpu, s := range a.mpsState.sup {
		if _, ok := want[gpu]; !ok {
			stop = append(stop, s)
			delete(a.mpsState.sup, gpu)
		}
	}
	var start []*mpsSupervisor
	for gpu, shape := range want {
		s, ok := a.mpsState.sup[gpu]
		if !ok {
			sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
			s = &mpsSupervisor{gpu: gpu, shapes: make(chan mpsShape, 1), cancel: cancel, done: make(chan struct{}),
				dirs: MPSDirs{Pipe: filepath.Join(a.cfg.HostRoot, v1.HostMPSSubdir, gpu, "pipe"),
					Log: filepath.Join(a.cfg.HostRoot, v1.HostMPSSubdir, gpu, "log")}}
			a.mpsState.sup[gpu] = s
			start = append(start, s)
			go func() {
				defer close(s.done)
				a.supervise(sctx, s)
			}()
		}
		select { // replace the pending size with the latest
		case <-s.shapes:
		default:
		}
		s.shapes <- shape
	}
	a.mpsState.mu.Unlock()
	for _, s := range start {
		a.log.InfoContext(ctx, "mps control daemon wanted", "gpu_uuid", s.gpu)
	}
	for _, s := range stop {
		a.log.InfoContext(ctx, "gpu left mps mode; stopping its mps control daemon", "gpu_uuid", s.gpu)
		s.cancel()
		<-s.done
	}
}

// stopAllMPS stops every supervisor and waits for them.
func (a *Agent) stopAllMPS() {
	a.mpsState.mu.Lock()
	all := a.mpsState.sup
	a.mpsState.sup = map[string]*mpsSupervisor{}
	a.mpsState.mu.Unlock()
	for _, s := range all {
		s.cancel()
	}
	for _, s := range all {
		<-s.done
	}
}

// supervise runs s's daemon until ctx ends: it prepares the directories
// and the GPU's compute mode, starts the daemon, waits until it answers,
// sets the client size, restarts it after DefaultMPSRestartDelay whenever
// it dies, restarts it when the size changes while it runs servers (their
// limits were fixed when they started), and when ctx ends tells it to quit
// (killing it after mpsQuitTimeout) and puts the GPU back in DEFAULT
// compute mode.
func (a *Agent) supervise(ctx context.Context, s *mpsSupervisor) {
	log := a.log.With("gpu_uuid", s.gpu)
	if err := a.mpsDirs(s.dirs); err != nil {
		log.ErrorContext(ctx, "mps directories", "err", err)
	}
	a.computeMode(ctx, s.gpu, nvml.COMPUTEMODE_EXCLUSIVE_PROCESS)
	defer a.computeMode(context.WithoutCancel(ctx), s.gpu, nvml.COMPUTEMODE_DEFAULT)
	defer a.setMPSStatus(s.gpu, func(st *MPSStatus) { st.Running, st.PID = false, 0 })
	shape := <-s.shapes
	crashed := false
	for {
		if crashed {
			a.setMPSStatus(s.gpu, func(st *MPSStatus) { st.Restarts++; st.Running, st.PID = false, 0 })
			a.metrics.mpsRestarts.WithLabelValues(s.gpu).Inc()
			select {
			case <-ctx.Done():
				return
			case <-time.After(DefaultMPSRestartDelay):
			}
		}
		crashed = true // unless the loop below says otherwise
		p, err := a.mps.Daemon(s.gpu, s.dirs)
		if err != nil {
			a.metrics.errors.WithLabelValues("mps").Inc()
			log.ErrorContext(ctx, "mps control daemon not started", "err", err)
			continue
		}
		exited := make(chan error, 1)
		go func() { exited <- p.Wait() }()
		if err := a.mpsReady(ctx, s, exited); err != nil {
			log.WarnContext(ctx, "mps control daemon not ready", "err", err, "pid", p.PID())
			a.endDaemon(context.WithoutCancel(ctx), s, p, exited)
			if ctx.Err() != nil {
				return
			}
			continue
		}
		if err := a.setShape(ctx, s, shape); err != nil {
			log.WarnContext(ctx, "mps client limits not set", "err", err)
		}
		a.setMPSStatus(s.gpu, func(st *MPSStatus) {
			st.Running, st.PID, st.MemoryMiB, st.Percent = true, p.PID(), shape.MemoryMiB, shape.Percent
		})
		log.InfoContext(ctx, "mps control daemon running", "pid", p.PID(), "mem_mib", shape.MemoryMiB, "sm_percent", shape.Percent)
	running:
		for {
			select {
			case err := <-exited:
				a.metrics.errors.WithLabelValues("mps").Inc()
				log.WarnContext(ctx, "mps control daemon exited; restarting it", "err", err, "pid", p.PID())
				break running
			case next := <-s.shapes:
				if next == shape {
					continue
				}
				servers, err := a.mps.Control(ctx, s.gpu, s.dirs, "get_server_list")
				if err == nil && strings.TrimSpace(servers) == "" {
					if err := a.setShape(ctx, s, next); err == nil {
						shape = next
						a.setMPSStatus(s.gpu, func(st *MPSStatus) { st.MemoryMiB, st.Percent = shape.MemoryMiB, shape.Percent })
						continue
					}
				}
				// Running servers keep the limits they started with: start
				// over so that the next clients get the new ones.
				log.InfoContext(ctx, "mps client size changed; restarting the daemon", "mem_mib", next.MemoryMiB, "sm_percent", next.Percent)
				shape = next
				a.endDaemon(ctx, s, p, exited)
				crashed = false
				break running
			case <-ctx.Done():
				a.endDaemon(context.WithoutCancel(ctx), s, p, exited)
				log.InfoContext(ctx, "mps control daemon stopped", "pid", p.PID())
				return
			}
		}
	}
}

// mpsReady waits until the daemon answers a control command.
func (a *Agent) mpsReady(ctx context.Context, s *mpsSupervisor, exited <-chan error) error {
	deadline := time.Now().Add(mpsReadyTimeout)
	wait := 10 * time.Millisecond
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := a.mps.Control(cctx, s.gpu, s.dirs, "get_default_active_thread_percentage")
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no answer within %s: %w", mpsReadyTimeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-exited:
			return fmt.Errorf("exited before answering: %w", err)
		case <-time.After(wait):
		}
		wait = min(2*wait, 500*time.Millisecond)
	}
}

// setShape sets sh as the daemon's defaults for the next servers.
func (a *Agent) setShape(ctx context.Context, s *mpsSupervisor, sh mpsShape) error {
	cctx, cancel := context.WithTimeout(ctx, mpsReadyTimeout)
	defer cancel()
	_, err := a.mps.Control(cctx, s.gpu, s.dirs, sh.commands()...)
	return err
}

// endDaemon tells the daemon to quit and waits for it, killing it after
// mpsQuitTimeout.
func (a *Agent) endDaemon(ctx context.Context, s *mpsSupervisor, p MPSProcess, exited <-chan error) {
	cctx, cancel := context.WithTimeout(ctx, mpsQuitTimeout)
	defer cancel()
	if _, err := a.mps.Control(cctx, s.gpu, s.dirs, "quit"); err != nil {
		a.log.DebugContext(ctx, "mps quit", "gpu_uuid", s.gpu, "err", err)
	}
	select {
	case <-exited:
	case <-cctx.Done():
		_ = p.Kill()
		<-exited
	}
}

// mpsDirs makes the daemon's pipe and log directories (0755, the agent's)
// and the node's MPS shared memory directory (1777, as /dev/shm is).
func (a *Agent) mpsDirs(d MPSDirs) error {
	for _, dir := range []string{d.Pipe, d.Log} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	shm := filepath.Join(a.cfg.HostRoot, v1.HostMPSSubdir, "shm")
	if err := os.MkdirAll(shm, 0o755); err != nil {
		return err
	}
	return os.Chmod(shm, 0o1777|os.ModeSticky)
}

// computeMode sets gpu's compute mode where NVML can; failures are logged.
func (a *Agent) computeMode(ctx context.Context, gpu string, mode nvml.ComputeMode) {
	if !a.has("nvmlDeviceSetComputeMode") {
		return
	}
	d := a.devs.byUUID(gpu)
	if d == nil {
		return
	}
	if ret := d.handle.SetComputeMode(mode); ret != nvml.SUCCESS {
		a.metrics.errors.WithLabelValues("nvml").Inc()
		a.log.WarnContext(ctx, "compute mode not set", "gpu_uuid", gpu, "mode", int(mode), "err", ret.Error())
	}
}
