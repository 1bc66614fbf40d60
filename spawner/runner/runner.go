package runner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// FieldManager is the field manager of every write the runner makes.
const FieldManager = "gpubroker-runner"

// Defaults applied by New.
var (
	// DefaultCIDR is the pod IP range: loopback addresses, which Linux
	// routes to this machine without any setup.
	DefaultCIDR = netip.MustParsePrefix("127.65.0.0/16")
)

// Defaults applied by New.
const (
	DefaultProbeInterval = 200 * time.Millisecond
	DefaultBackoff       = 10 * time.Second // the kubelet's first crash-loop back-off
	DefaultMaxBackoff    = 5 * time.Minute  // the kubelet's cap
	DefaultStopGrace     = 10 * time.Second
	DefaultNodeIP        = "127.0.0.1"
)

// backoffReset is how long a container must run before its crash-loop
// back-off starts again from Config.Backoff (the kubelet forgets a back-off
// after twice its cap).
const backoffReset = 10 * time.Minute

// Image is what the runner knows of a container image: what a container
// of it runs when the pod leaves command or args unset, and the environment
// and PATH it provides.
type Image struct {
	// Entrypoint and Cmd are the image's ENTRYPOINT and CMD. A container's
	// command replaces Entrypoint (and drops Cmd); its args replace Cmd.
	Entrypoint, Cmd []string
	// Env is the image's environment, NAME=value, below the pod's.
	Env []string
	// PathDirs are local directories put in front of PATH (the image's own
	// executables, such as a stand-in for an entrypoint script).
	PathDirs []string
}

// Limiter runs a container's process under the GPU limiter.
type Limiter struct {
	// Wrap returns the argv that runs argv of pod in the slice whose host
	// directories are quotaDir (to appear read-only at the hook's fixed
	// quota path) and usageDir (read-write at its usage path); it may first
	// lay out the slice as the node agent would (limiter/hook/podhook does).
	// An error fails the container's start (StartError, with the message).
	Wrap func(pod *corev1.Pod, quotaDir, usageDir string, argv []string) ([]string, error)
	// Env is added to the process's environment (LD_PRELOAD of the hook,
	// LD_LIBRARY_PATH of the stub driver), above the pod's.
	Env []string
}

// Config configures a Runner. Client, Nodes and Dir are required.
type Config struct {
	// Client reaches the API server (or a fake clientset in dev mode).
	Client kubernetes.Interface
	// Namespace limits the runner to one namespace; "" means all.
	Namespace string
	// Nodes are the nodes the runner plays kubelet for: pods whose
	// spec.nodeName is one of them run here. Run registers them.
	Nodes []string
	// NodeIP is the nodes' InternalIP and every pod's host IP; default
	// DefaultNodeIP.
	NodeIP string
	// Dir is the runner's local state: one directory per pod (home,
	// working directory, logs). Must be absolute.
	Dir string
	// HostRoot is the local directory standing for the nodes' root
	// filesystem: hostPath P is HostRoot+P. Default Dir/host.
	HostRoot string
	// Images maps an image reference to what the runner knows of it; a pod
	// whose image is missing waits in ErrImageNeverPull.
	Images map[string]Image
	// BaseEnv is the environment every process starts from (PATH, LANG, …),
	// NAME=value; the image's and the pod's come on top. Nil means PATH,
	// LANG and TZ of this process.
	BaseEnv []string
	// CIDR is the pod IP range; default DefaultCIDR. Its first address and
	// its last are never handed out.
	CIDR netip.Prefix
	// ProbeInterval caps the readiness probe period; default
	// DefaultProbeInterval.
	ProbeInterval time.Duration
	// Backoff is the first crash-loop back-off, doubled after every further
	// crash up to MaxBackoff; defaults DefaultBackoff and DefaultMaxBackoff.
	Backoff, MaxBackoff time.Duration
	// StopGrace caps a pod's termination grace period; default
	// DefaultStopGrace.
	StopGrace time.Duration
	// Limiter, when set, runs containers that mount the limiter's preload
	// file through it.
	Limiter *Limiter
	// Log receives the runner's own log lines; nil discards.
	Log *slog.Logger
}

// Runner runs pods as local processes. Create it with New and call Run once.
// Its methods are safe for concurrent use.
type Runner struct {
	cfg Config
	log *slog.Logger
	ips *ipam

	mu      sync.Mutex
	workers map[types.UID]*worker
	wg      sync.WaitGroup
	ctx     context.Context // Run's; nil before Run
}

// New checks cfg, applies the defaults and returns a Runner. It starts
// nothing.
func New(cfg Config) (*Runner, error) {
	var errs []error
	if cfg.Client == nil {
		errs = append(errs, errors.New("runner: no Kubernetes client"))
	}
	if len(cfg.Nodes) == 0 {
		errs = append(errs, errors.New("runner: no nodes"))
	}
	if !filepath.IsAbs(cfg.Dir) {
		errs = append(errs, fmt.Errorf("runner: dir %q is not absolute", cfg.Dir))
	}
	if cfg.HostRoot == "" {
		cfg.HostRoot = filepath.Join(cfg.Dir, "host")
	} else if !filepath.IsAbs(cfg.HostRoot) {
		errs = append(errs, fmt.Errorf("runner: host root %q is not absolute", cfg.HostRoot))
	}
	if !cfg.CIDR.IsValid() {
		cfg.CIDR = DefaultCIDR
	}
	if !cfg.CIDR.Addr().Is4() || cfg.CIDR.Bits() > 30 {
		errs = append(errs, fmt.Errorf("runner: pod CIDR %s must be IPv4 with room for at least two pods", cfg.CIDR))
	}
	if cfg.Limiter != nil && cfg.Limiter.Wrap == nil {
		errs = append(errs, errors.New("runner: limiter without Wrap"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if cfg.NodeIP == "" {
		cfg.NodeIP = DefaultNodeIP
	}
	if cfg.ProbeInterval <= 0 {
		cfg.ProbeInterval = DefaultProbeInterval
	}
	if cfg.Backoff <= 0 {
		cfg.Backoff = DefaultBackoff
	}
	if cfg.MaxBackoff < cfg.Backoff {
		cfg.MaxBackoff = max(DefaultMaxBackoff, cfg.Backoff)
	}
	if cfg.StopGrace <= 0 {
		cfg.StopGrace = DefaultStopGrace
	}
	if cfg.BaseEnv == nil {
		for _, k := range []string{"PATH", "LANG", "TZ"} {
			if v, ok := os.LookupEnv(k); ok {
				cfg.BaseEnv = append(cfg.BaseEnv, k+"="+v)
			}
		}
	}
	cfg.Nodes = slices.Clone(cfg.Nodes)
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Runner{cfg: cfg, log: log, ips: newIPAM(cfg.CIDR), workers: map[types.UID]*worker{}}, nil
}

// Run registers the nodes, then runs every pod bound to them until ctx is
// done; then it stops every process (SIGTERM, SIGKILL after the grace) and
// returns once they are reaped and its goroutines have exited. It returns
// an error only when the nodes cannot be registered or Run was called twice.
func (r *Runner) Run(ctx context.Context) error {
	r.mu.Lock()
	if r.ctx != nil {
		r.mu.Unlock()
		return errors.New("runner: Run called twice")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r.ctx = ctx
	r.mu.Unlock()
	if err := os.MkdirAll(r.cfg.HostRoot, 0o755); err != nil {
		return fmt.Errorf("runner: %w", err)
	}
	for _, n := range r.cfg.Nodes {
		if err := r.registerNode(ctx, n); err != nil {
			return err
		}
	}
	opts := []informers.SharedInformerOption{}
	if r.cfg.Namespace != "" {
		opts = append(opts, informers.WithNamespace(r.cfg.Namespace))
	}
	factory := informers.NewSharedInformerFactoryWithOptions(r.cfg.Client, 0, opts...)
	informer := factory.Core().V1().Pods().Informer()
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { r.observe(obj, false) },
		UpdateFunc: func(_, obj any) { r.observe(obj, false) },
		DeleteFunc: func(obj any) { r.observe(obj, true) },
	}); err != nil {
		return fmt.Errorf("runner: add pod handler: %w", err)
	}
	factory.Start(ctx.Done())
	r.log.InfoContext(ctx, "pod runner started: pods on these nodes run as local processes", "nodes", r.cfg.Nodes, "dir", r.cfg.Dir, "cidr", r.cfg.CIDR.String())
	<-ctx.Done()
	factory.Shutdown()
	r.wg.Wait() // workers stop their processes when ctx ends
	return nil
}

// registerNode creates node name if missing and marks it Ready.
func (r *Runner) registerNode(ctx context.Context, name string) error {
	api := r.cfg.Client.CoreV1().Nodes()
	node, err := api.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		node, err = api.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{
			Name:   name,
			Labels: map[string]string{"kubernetes.io/hostname": name, "gpubroker.io/runner": "true"},
		}}, metav1.CreateOptions{FieldManager: FieldManager})
	}
	if err != nil {
		return fmt.Errorf("runner: register node %s: %w", name, err)
	}
	node = node.DeepCopy()
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("64"),
		corev1.ResourceMemory: resource.MustParse("512Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	now := metav1.Now()
	node.Status.Capacity, node.Status.Allocatable = capacity, capacity
	node.Status.Phase = corev1.NodeRunning
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: r.cfg.NodeIP}, {Type: corev1.NodeHostName, Address: name}}
	node.Status.Conditions = []corev1.NodeCondition{{
		Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
		Message: "gpubroker pod runner: pods run as local processes", LastHeartbeatTime: now, LastTransitionTime: now,
	}}
	if _, err := api.UpdateStatus(ctx, node, metav1.UpdateOptions{FieldManager: FieldManager}); err != nil {
		return fmt.Errorf("runner: mark node %s ready: %w", name, err)
	}
	return nil
}

// observe hands a pod change to its worker, starting one for a new pod on
// one of the runner's nodes.
func (r *Runner) observe(obj any, deleted bool) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj, deleted = tomb.Obj, true
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok || !slices.Contains(r.cfg.Nodes, pod.Spec.NodeName) {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	w := r.workers[pod.UID]
	if w == nil {
		if deleted || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			return
		}
		if r.ctx.Err() != nil {
			return
		}
		w = newWorker(r, pod)
		r.workers[pod.UID] = w
		r.wg.Go(func() {
			w.run(r.ctx)
			r.mu.Lock()
			delete(r.workers, pod.UID)
			r.mu.Unlock()
		})
	}
	w.offer(pod, deleted)
}

// worker returns the worker of the live pod namespace/name, or nil.
func (r *Runner) worker(namespace, name string) *worker {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range r.workers {
		if w.namespace == namespace && w.name == name {
			return w
		}
	}
	return nil
}

// ErrNoProcess is returned by Signal when the pod has no running process.
var ErrNoProcess = errors.New("runner: the pod has no running process")

// Signal sends sig to the process group of pod namespace/name's running
// container (a test's stand-in for a crash or an OOM kill); ErrNoProcess
// when there is none.
func (r *Runner) Signal(namespace, name string, sig syscall.Signal) error {
	w := r.worker(namespace, name)
	if w == nil {
		return ErrNoProcess
	}
	return w.signal(sig)
}

// Log returns the last n lines of the output of pod namespace/name's
// current or last container process, or "" when there is none.
func (r *Runner) Log(namespace, name string, n int) string {
	w := r.worker(namespace, name)
	if w == nil {
		return ""
	}
	return w.logTail(n)
}
