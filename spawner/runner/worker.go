package runner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// worker runs one pod: its goroutine (run) owns the process and the pod's
// status; observe hands it pod updates through offer.
type worker struct {
	r               *Runner
	namespace, name string
	uid             types.UID
	dir             string // the pod's local directory
	log             *slog.Logger

	wake chan struct{} // capacity 1: an update is waiting in latest

	mu      sync.Mutex
	latest  *corev1.Pod // newest observed pod
	gone    bool        // the pod was deleted
	current *process    // the running process, for signal and logTail
	logPath string      // output of the current or last process

	// Owned by run.
	pod        *corev1.Pod
	ip         string
	startedAt  metav1.Time // pod start (status.startTime)
	everRan    bool
	proc       *process
	logOffset  int64 // size of the log before the current process started
	restarts   int32
	crashes    int // failed exits since the last back-off reset
	backoff    time.Duration
	nextStart  time.Time
	waiting    *corev1.ContainerStateWaiting
	terminated *corev1.ContainerStateTerminated // the current state, when not running
	lastTerm   *corev1.ContainerStateTerminated
	ready      bool
	final      corev1.PodPhase // Succeeded or Failed once the pod is done
	conds      map[corev1.PodConditionType]corev1.PodCondition
	written    *corev1.PodStatus
}

func newWorker(r *Runner, pod *corev1.Pod) *worker {
	return &worker{
		r: r, namespace: pod.Namespace, name: pod.Name, uid: pod.UID,
		dir:   filepath.Join(r.cfg.Dir, "pods", pod.Namespace+"_"+pod.Name+"_"+string(pod.UID)),
		log:   r.log.With("pod", pod.Namespace+"/"+pod.Name),
		wake:  make(chan struct{}, 1),
		conds: map[corev1.PodConditionType]corev1.PodCondition{},
	}
}

// offer records the newest state of the pod and wakes the worker.
func (w *worker) offer(pod *corev1.Pod, deleted bool) {
	w.mu.Lock()
	w.latest = pod
	w.gone = w.gone || deleted
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (w *worker) signal(sig syscall.Signal) error {
	w.mu.Lock()
	p := w.current
	w.mu.Unlock()
	if p == nil {
		return ErrNoProcess
	}
	select {
	case <-p.done:
		return ErrNoProcess
	default:
	}
	return p.signal(sig)
}

func (w *worker) logTail(n int) string {
	w.mu.Lock()
	path := w.logPath
	w.mu.Unlock()
	if path == "" {
		return ""
	}
	return tailFile(path, n)
}

// run drives the pod until it is gone, deleted (then it removes it) or ctx
// ends; the process is always stopped and reaped before it returns.
func (w *worker) run(ctx context.Context) {
	defer w.r.ips.release(w.uid)
	defer func() {
		if w.proc != nil {
			w.proc.stop(ctx, 0)
		}
	}()
	tick := time.NewTicker(w.r.cfg.ProbeInterval)
	defer tick.Stop()
	for {
		var exited <-chan struct{}
		if w.proc != nil {
			exited = w.proc.done
		}
		select {
		case <-ctx.Done():
			if w.proc != nil {
				w.proc.stop(context.WithoutCancel(ctx), w.grace())
				w.proc = nil
			}
			return
		case <-w.wake:
			w.mu.Lock()
			pod, gone := w.latest, w.gone
			w.mu.Unlock()
			if gone {
				return // removed at once: the deferred stop kills the process
			}
			w.pod = pod
			if pod.DeletionTimestamp != nil {
				w.terminate(ctx)
				return
			}
		case <-exited:
			w.exited()
		case <-tick.C:
		}
		w.step(ctx)
		w.writeStatus(ctx)
	}
}

// grace is the pod's termination grace, capped by Config.StopGrace.
func (w *worker) grace() time.Duration {
	g := w.r.cfg.StopGrace
	if w.pod != nil && w.pod.Spec.TerminationGracePeriodSeconds != nil {
		g = min(g, time.Duration(*w.pod.Spec.TerminationGracePeriodSeconds)*time.Second)
	}
	if w.pod != nil && w.pod.DeletionGracePeriodSeconds != nil {
		g = min(g, time.Duration(*w.pod.DeletionGracePeriodSeconds)*time.Second)
	}
	return max(g, 0)
}

// terminate stops the process of a pod being deleted within its grace and
// then removes the pod, as the kubelet's final delete does.
func (w *worker) terminate(ctx context.Context) {
	if w.proc != nil {
		w.proc.stop(ctx, w.grace())
		w.proc = nil
	}
	zero := int64(0)
	err := w.r.cfg.Client.CoreV1().Pods(w.namespace).Delete(ctx, w.name, metav1.DeleteOptions{
		GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &w.uid},
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) && ctx.Err() == nil {
		w.log.WarnContext(ctx, "remove terminated pod", "err", err)
	}
}

// exited records the end of the current process and applies the restart
// policy.
func (w *worker) exited() {
	p := w.proc
	w.proc = nil
	w.ready = false
	term := &corev1.ContainerStateTerminated{
		ExitCode: p.exit.code, Signal: p.exit.signal,
		StartedAt: metav1.NewTime(p.started), FinishedAt: metav1.NewTime(p.exit.finished),
		ContainerID: containerID(p),
	}
	if p.exit.code == 0 {
		term.Reason = "Completed"
	} else {
		term.Reason = "Error"
		if w.mainContainer().TerminationMessagePolicy == corev1.TerminationMessageFallbackToLogsOnError {
			term.Message = terminationMessage(p.log, w.logOffset)
		}
	}
	w.log.Info("container exited", "exit_code", p.exit.code, "signal", p.exit.signal)
	w.ended(term, p.exit.finished.Sub(p.started))
}

// ended applies the restart policy to a container that ended with term
// after running for ran.
func (w *worker) ended(term *corev1.ContainerStateTerminated, ran time.Duration) {
	policy := w.pod.Spec.RestartPolicy
	restart := policy == corev1.RestartPolicyAlways || (policy == corev1.RestartPolicyOnFailure && term.ExitCode != 0)
	w.waiting = nil
	if !restart {
		w.terminated = term
		w.final = corev1.PodSucceeded
		if term.ExitCode != 0 {
			w.final = corev1.PodFailed
		}
		return
	}
	if ran >= backoffReset {
		w.crashes, w.backoff = 0, 0
	}
	w.crashes++
	w.restarts++
	w.lastTerm = term
	if w.crashes == 1 {
		// The kubelet restarts a container that failed for the first time at
		// once; the state shows the end until the new process runs.
		w.terminated = term
		w.nextStart = time.Time{}
		return
	}
	if w.backoff == 0 {
		w.backoff = w.r.cfg.Backoff
	} else {
		w.backoff = min(2*w.backoff, w.r.cfg.MaxBackoff)
	}
	w.terminated = nil
	w.nextStart = time.Now().Add(w.backoff)
	w.waiting = &corev1.ContainerStateWaiting{Reason: reasonCrashLoop,
		Message: fmt.Sprintf("back-off %s restarting failed container=%s pod=%s_%s(%s)", w.backoff, w.mainContainer().Name, w.name, w.namespace, w.uid)}
}

func (w *worker) mainContainer() corev1.Container {
	if w.pod == nil || len(w.pod.Spec.Containers) == 0 {
		return corev1.Container{}
	}
	return w.pod.Spec.Containers[0]
}

// step moves the pod forward: an IP, a process once it may start, a
// readiness probe while it is not ready.
func (w *worker) step(ctx context.Context) {
	if w.pod == nil || w.final != "" || len(w.pod.Spec.Containers) == 0 {
		return
	}
	if w.ip == "" {
		ip, ok := w.freeIP()
		if !ok {
			w.waiting = &corev1.ContainerStateWaiting{Reason: reasonCreating, Message: "no free pod IP in " + w.r.cfg.CIDR.String()}
			return
		}
		w.ip = ip
		w.startedAt = metav1.Now()
		if err := os.MkdirAll(filepath.Join(w.dir, "logs"), 0o755); err != nil {
			w.waiting = &corev1.ContainerStateWaiting{Reason: reasonCreating, Message: err.Error()}
			return
		}
	}
	if w.proc == nil && !time.Now().Before(w.nextStart) {
		w.startProcess(ctx)
	}
	if w.proc != nil && !w.ready {
		w.ready = w.probe(ctx)
	}
}

// freeIP takes a pod IP whose container ports nothing on this machine
// listens on yet: another runner, or an earlier test's leftover, may use
// the same range. Taken addresses stay held by this pod's UID only while
// it is tried.
func (w *worker) freeIP() (string, bool) {
	for range 64 {
		ip, ok := w.r.ips.get(w.uid)
		if !ok {
			return "", false
		}
		if w.portsFree(ip.String()) {
			return ip.String(), true
		}
		w.log.Info("pod IP in use on this machine; trying the next one", "pod_ip", ip.String())
		w.r.ips.skip(w.uid)
	}
	return "", false
}

// portsFree reports whether every container port of the pod can be bound
// on ip.
func (w *worker) portsFree(ip string) bool {
	for _, c := range w.pod.Spec.Containers {
		for _, p := range c.Ports {
			if p.Protocol != "" && p.Protocol != corev1.ProtocolTCP {
				continue
			}
			ln, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(int(p.ContainerPort))))
			if err != nil {
				return false
			}
			ln.Close()
		}
	}
	return true
}

// startProcess prepares and starts the container's process, or records
// what it waits for or why it failed to start.
func (w *worker) startProcess(ctx context.Context) {
	l, err := w.prepare(ctx, w.pod, w.ip)
	var we *waitError
	switch {
	case errors.As(err, &we):
		w.waiting = &corev1.ContainerStateWaiting{Reason: we.reason, Message: we.message}
		w.terminated = nil
		return
	case err != nil:
		w.startFailed(err)
		return
	}
	logPath := filepath.Join(w.dir, "logs", fmt.Sprintf("%s-%d.log", w.mainContainer().Name, w.restarts))
	p, err := start(l, logPath)
	if err != nil {
		w.startFailed(err)
		return
	}
	w.proc, w.everRan, w.logOffset = p, true, 0
	w.waiting, w.terminated = nil, nil
	w.mu.Lock()
	w.current, w.logPath = p, logPath
	w.mu.Unlock()
	w.log.Info("container started", "pid", p.cmd.Process.Pid, "pod_ip", w.ip, "argv", l.argv)
}

// startFailed records a process that could not be started: the runtime's
// StartError, exit code 128, which the restart policy then handles like a
// crash.
func (w *worker) startFailed(err error) {
	now := metav1.Now()
	w.log.Warn("container could not start", "err", err)
	w.ended(&corev1.ContainerStateTerminated{ExitCode: 128, Reason: reasonStartError, Message: err.Error(), StartedAt: now, FinishedAt: now}, 0)
}

// probe runs the container's readiness probe once against the pod IP.
func (w *worker) probe(ctx context.Context) bool {
	c := w.mainContainer()
	pr := c.ReadinessProbe
	if pr == nil {
		return true
	}
	timeout := time.Second
	if pr.TimeoutSeconds > 0 {
		timeout = time.Duration(pr.TimeoutSeconds) * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	switch {
	case pr.TCPSocket != nil:
		port, ok := resolvePort(c, pr.TCPSocket.Port)
		if !ok {
			return false
		}
		conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", net.JoinHostPort(w.ip, strconv.Itoa(port)))
		if err != nil {
			return false
		}
		conn.Close()
		return true
	case pr.HTTPGet != nil:
		port, ok := resolvePort(c, pr.HTTPGet.Port)
		if !ok {
			return false
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(w.ip, strconv.Itoa(port))+pr.HTTPGet.Path, nil)
		if err != nil {
			return false
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode >= 200 && resp.StatusCode < 400
	}
	return true
}

// resolvePort turns a probe's port (a number or a container port name) into
// a number.
func resolvePort(c corev1.Container, p intstr.IntOrString) (int, bool) {
	if p.Type == intstr.Int {
		return p.IntValue(), p.IntValue() > 0
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return int(cp.ContainerPort), true
		}
	}
	return 0, false
}

func containerID(p *process) string {
	return "runner://" + strconv.Itoa(p.cmd.Process.Pid)
}

// status is the pod status the worker's state stands for.
func (w *worker) status() corev1.PodStatus {
	c := w.mainContainer()
	cs := corev1.ContainerStatus{Name: c.Name, Image: c.Image, RestartCount: w.restarts, Ready: w.ready && w.proc != nil, LastTerminationState: corev1.ContainerState{Terminated: w.lastTerm}}
	started := w.proc != nil
	cs.Started = &started
	if w.everRan {
		cs.ImageID = "runner://" + c.Image
	}
	switch {
	case w.proc != nil:
		cs.State.Running = &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(w.proc.started)}
		cs.ContainerID = containerID(w.proc)
	case w.terminated != nil:
		cs.State.Terminated = w.terminated
		cs.ContainerID = w.terminated.ContainerID
	case w.waiting != nil:
		cs.State.Waiting = w.waiting
	default:
		cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: reasonCreating}
	}
	phase := corev1.PodPending
	switch {
	case w.final != "":
		phase = w.final
	case w.everRan || w.restarts > 0:
		phase = corev1.PodRunning
	}
	ready := cs.Ready && w.final == ""
	w.setCond(corev1.PodScheduled, true, "")
	w.setCond(corev1.PodInitialized, true, "")
	w.setCond(corev1.PodReadyToStartContainers, w.ip != "", "")
	notReady := "ContainersNotReady"
	if w.final != "" {
		notReady = "PodCompleted"
	}
	w.setCond(corev1.ContainersReady, ready, notReady)
	w.setCond(corev1.PodReady, ready, notReady)
	st := corev1.PodStatus{
		Phase:             phase,
		HostIP:            w.r.cfg.NodeIP,
		HostIPs:           []corev1.HostIP{{IP: w.r.cfg.NodeIP}},
		ContainerStatuses: []corev1.ContainerStatus{cs},
	}
	for _, t := range []corev1.PodConditionType{corev1.PodReadyToStartContainers, corev1.PodInitialized, corev1.PodReady, corev1.ContainersReady, corev1.PodScheduled} {
		st.Conditions = append(st.Conditions, w.conds[t])
	}
	if w.ip != "" {
		st.PodIP = w.ip
		st.PodIPs = []corev1.PodIP{{IP: w.ip}}
		st.StartTime = &w.startedAt
	}
	return st
}

// setCond sets condition t, keeping its transition time while its status
// does not change.
func (w *worker) setCond(t corev1.PodConditionType, ok bool, reason string) {
	s := corev1.ConditionFalse
	if ok {
		s, reason = corev1.ConditionTrue, ""
	}
	if c, found := w.conds[t]; found && c.Status == s && c.Reason == reason {
		return
	}
	w.conds[t] = corev1.PodCondition{Type: t, Status: s, Reason: reason, LastTransitionTime: metav1.Now()}
}

// writeStatus writes the pod's status when it changed, on a fresh copy of
// the newest pod (retrying once with a re-read pod on a conflict).
func (w *worker) writeStatus(ctx context.Context) {
	if w.pod == nil || ctx.Err() != nil {
		return
	}
	st := w.status()
	if w.written != nil && equality.Semantic.DeepEqual(*w.written, st) {
		return
	}
	api := w.r.cfg.Client.CoreV1().Pods(w.namespace)
	pod := w.pod.DeepCopy()
	for attempt := 0; ; attempt++ {
		pod.Status = st
		_, err := api.UpdateStatus(ctx, pod, metav1.UpdateOptions{FieldManager: FieldManager})
		if err == nil {
			w.written = &st
			return
		}
		if !apierrors.IsConflict(err) || attempt > 0 {
			if !apierrors.IsNotFound(err) && ctx.Err() == nil {
				w.log.WarnContext(ctx, "pod status not written; retrying on the next step", "err", err)
			}
			return
		}
		fresh, gerr := api.Get(ctx, w.name, metav1.GetOptions{})
		if gerr != nil || fresh.UID != w.uid {
			return
		}
		pod = fresh.DeepCopy()
	}
}
