package spawner

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Phase is the spawner's reading of a notebook pod, coarser than the pod's
// own phase and aligned with the server lifecycle of ARCHITECTURE.md.
type Phase string

// The phases, in lifecycle order. Failed and Gone are terminal for a spawn.
const (
	// PhasePending: the pod exists but no kubelet has started on it yet
	// (waiting for its node, or unschedulable within StartTimeout).
	PhasePending Phase = "pending"
	// PhaseStarting: the pod is on its node; the image is pulling or the
	// container is starting, or restarting after a crash.
	PhaseStarting Phase = "starting"
	// PhaseRunning: the pod is Ready and has a pod IP; URL is set.
	PhaseRunning Phase = "running"
	// PhaseStopping: the pod is being deleted (its deletionTimestamp is set);
	// the slice is still in use until PhaseGone.
	PhaseStopping Phase = "stopping"
	// PhaseFailed: the pod will not run (or no longer runs) the notebook;
	// the message says why. The pod still exists and should be deleted.
	PhaseFailed Phase = "failed"
	// PhaseGone: the pod has been deleted, or its deletion is complete
	// but for finalizers (Ended): its containers are gone and the object
	// stays only until v1.FinalizerServerRecord is removed.
	PhaseGone Phase = "gone"
)

// Container waiting reasons reported by the kubelet.
const (
	reasonInvalidImageName  = "InvalidImageName"
	reasonErrImageNeverPull = "ErrImageNeverPull"
	reasonErrImagePull      = "ErrImagePull"
	reasonImagePullBackOff  = "ImagePullBackOff"
	reasonCrashLoopBackOff  = "CrashLoopBackOff"
	reasonCreateConfig      = "CreateContainerConfigError"
	reasonCreateContainer   = "CreateContainerError"
	reasonRunContainer      = "RunContainerError"
	reasonContainerCreate   = "ContainerCreating"
	reasonPodInitializing   = "PodInitializing"
	// reasonNodeLost is the pod status reason the node lifecycle controller
	// sets when it cannot confirm the pod's state.
	reasonNodeLost = "NodeLost"
)

// Ended reports whether pod's deletion is complete but for its finalizers:
// a deletion with grace period 0 was asked for, which is the kubelet's
// final delete once the containers have stopped (or a forced deletion, or
// the pod garbage collector's for a deleted node). The API server keeps
// such a pod until its finalizers are removed, and removes it at once
// after (ShouldDeleteDuringUpdate in k8s.io/apiserver's generic registry).
// A pod still within its grace period has not ended: its containers may
// still run on the GPU.
func Ended(pod *corev1.Pod) bool {
	g := pod.DeletionGracePeriodSeconds
	return pod.DeletionTimestamp != nil && g != nil && *g == 0
}

// Classify reads a notebook pod's status at time now and returns its phase and
// a sentence for the user. It is pure. cfg supplies StartTimeout and ErrorGrace
// (defaults apply to zero values). A nil pod is PhaseGone, and so is a pod
// that Ended.
//
// It fails fast on terminal conditions:
//   - pod phase Failed (evicted, ...), Succeeded (the notebook exited) or
//     Unknown, or status reason NodeLost;
//   - InvalidImageName and ErrImageNeverPull at once;
//   - CrashLoopBackOff at once (with OnFailure, a crash loop means at least
//     two crashes in a row);
//   - ErrImagePull or ImagePullBackOff, and CreateContainerConfigError,
//     CreateContainerError or RunContainerError, still present ErrorGrace
//     after the pod was scheduled: the kubelet's pull backoff is 10 s, 20 s,
//     40 s, so the 90 s default means about three failed attempts;
//   - PodScheduled=False (Unschedulable) for StartTimeout, or no container
//     status from the pod's node StartTimeout after creation;
//   - a Ready pod whose Ready condition turned False while its container still
//     reports ready (the node stopped reporting) for StartTimeout.
//
// Unknown timestamps (zero) count as "just now", so deadlines never fire on
// objects that lack them. A container still ContainerCreating (pulling its
// image, mounting volumes) has no deadline here: a large image may take
// longer than StartTimeout, so the broker's overall spawn timeout applies.
func Classify(pod *corev1.Pod, now time.Time, cfg Config) (Phase, string) {
	cfg = cfg.WithDefaults()
	if pod == nil {
		return PhaseGone, "the notebook pod is gone"
	}
	node := pod.Spec.NodeName
	since := func(t time.Time) time.Duration {
		if t.IsZero() || now.Before(t) {
			return 0
		}
		return now.Sub(t)
	}
	created := pod.CreationTimestamp.Time

	if Ended(pod) {
		return PhaseGone, "the notebook pod is gone"
	}
	if pod.Status.Reason == reasonNodeLost || pod.Status.Phase == corev1.PodUnknown {
		return PhaseFailed, fmt.Sprintf("lost contact with node %s", node)
	}
	if pod.DeletionTimestamp != nil {
		return PhaseStopping, "the notebook is shutting down"
	}
	cs := notebookStatus(pod)
	switch pod.Status.Phase {
	case corev1.PodFailed:
		return PhaseFailed, failedMessage(pod, cs)
	case corev1.PodSucceeded:
		return PhaseFailed, "the notebook exited"
	}

	scheduled := condition(pod, corev1.PodScheduled)
	if scheduled != nil && scheduled.Status == corev1.ConditionFalse {
		why := strings.TrimSpace(scheduled.Message)
		if why == "" {
			why = scheduled.Reason
		}
		start := scheduled.LastTransitionTime.Time
		if start.IsZero() {
			start = created
		}
		if since(start) >= cfg.StartTimeout {
			return PhaseFailed, fmt.Sprintf("the notebook could not be scheduled for %s: %s", cfg.StartTimeout, why)
		}
		return PhasePending, "waiting for a node: " + why
	}
	if cs == nil {
		if node == "" {
			return PhasePending, "waiting to be scheduled"
		}
		if since(created) >= cfg.StartTimeout {
			return PhaseFailed, fmt.Sprintf("node %s did not start the notebook within %s", node, cfg.StartTimeout)
		}
		return PhasePending, fmt.Sprintf("waiting for node %s", node)
	}

	onNode := created
	if scheduled != nil && scheduled.Status == corev1.ConditionTrue && !scheduled.LastTransitionTime.IsZero() {
		onNode = scheduled.LastTransitionTime.Time
	}
	image := notebookImage(pod)
	if w := cs.State.Waiting; w != nil {
		detail := strings.TrimSpace(w.Message)
		switch w.Reason {
		case reasonInvalidImageName, reasonErrImageNeverPull:
			return PhaseFailed, withDetail(fmt.Sprintf("cannot use image %s", image), detail)
		case reasonCrashLoopBackOff:
			return PhaseFailed, crashMessage(pod, cs)
		case reasonErrImagePull, reasonImagePullBackOff:
			if since(onNode) >= cfg.ErrorGrace {
				return PhaseFailed, withDetail(fmt.Sprintf("could not pull image %s on node %s", image, node), detail)
			}
			return PhaseStarting, withDetail(fmt.Sprintf("pulling image %s on node %s (retrying)", image, node), detail)
		case reasonCreateConfig, reasonCreateContainer, reasonRunContainer:
			if since(onNode) >= cfg.ErrorGrace {
				return PhaseFailed, withDetail("could not start the notebook container", detail)
			}
			return PhaseStarting, withDetail("starting the notebook container (retrying)", detail)
		case reasonContainerCreate, reasonPodInitializing, "":
			if cs.ImageID == "" && cs.RestartCount == 0 {
				return PhaseStarting, fmt.Sprintf("pulling image %s on node %s", image, node)
			}
			return PhaseStarting, fmt.Sprintf("starting the notebook on node %s", node)
		default:
			return PhaseStarting, withDetail(fmt.Sprintf("starting the notebook on node %s: %s", node, w.Reason), detail)
		}
	}
	if t := cs.State.Terminated; t != nil {
		return PhaseStarting, fmt.Sprintf("the notebook %s; restarting", exitText(pod, t))
	}
	if cs.State.Running == nil {
		return PhaseStarting, fmt.Sprintf("starting the notebook on node %s", node)
	}

	ready := condition(pod, corev1.PodReady)
	switch {
	case ready != nil && ready.Status == corev1.ConditionTrue && pod.Status.PodIP != "":
		return PhaseRunning, fmt.Sprintf("running on node %s", node)
	case ready != nil && ready.Status == corev1.ConditionFalse && cs.Ready && pod.Status.PodIP != "":
		// The node lifecycle controller flipped Ready; the kubelet did not.
		lost := since(ready.LastTransitionTime.Time)
		if lost >= cfg.StartTimeout {
			return PhaseFailed, fmt.Sprintf("node %s stopped responding %s ago", node, lost.Round(time.Second))
		}
		return PhaseRunning, fmt.Sprintf("running on node %s, which is not responding", node)
	}
	msg := fmt.Sprintf("the notebook is starting on node %s", node)
	if cs.RestartCount > 0 {
		msg += fmt.Sprintf(" (restarted %d times)", cs.RestartCount)
	}
	return PhaseStarting, msg
}

// URL returns the notebook's in-cluster address, http://<podIP>:<port>, or ""
// when the pod has no IP yet. The port is the container port named
// "notebook" (the one Pod sets).
func URL(pod *corev1.Pod) string {
	if pod == nil || pod.Status.PodIP == "" {
		return ""
	}
	port := 0
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if p.Name == portName || port == 0 {
				port = int(p.ContainerPort)
			}
		}
	}
	if port == 0 {
		return ""
	}
	return "http://" + net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(port))
}

func condition(pod *corev1.Pod, typ corev1.PodConditionType) *corev1.PodCondition {
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == typ {
			return &pod.Status.Conditions[i]
		}
	}
	return nil
}

// notebookStatus returns the notebook container's status, or nil.
func notebookStatus(pod *corev1.Pod) *corev1.ContainerStatus {
	for i := range pod.Status.ContainerStatuses {
		if pod.Status.ContainerStatuses[i].Name == ContainerName {
			return &pod.Status.ContainerStatuses[i]
		}
	}
	if len(pod.Status.ContainerStatuses) > 0 {
		return &pod.Status.ContainerStatuses[0]
	}
	return nil
}

func notebookImage(pod *corev1.Pod) string {
	for _, c := range pod.Spec.Containers {
		if c.Name == ContainerName {
			return c.Image
		}
	}
	if len(pod.Spec.Containers) > 0 {
		return pod.Spec.Containers[0].Image
	}
	return "(none)"
}

func withDetail(msg, detail string) string {
	if detail == "" {
		return msg
	}
	return msg + ": " + detail
}

// exitText describes a terminated container: "exited with code 1",
// "ran out of memory (limit 4Gi)".
func exitText(pod *corev1.Pod, t *corev1.ContainerStateTerminated) string {
	if t.Reason == "OOMKilled" {
		for _, c := range pod.Spec.Containers {
			if q, ok := c.Resources.Limits[corev1.ResourceMemory]; ok && c.Name == ContainerName {
				return fmt.Sprintf("ran out of memory (limit %s)", q.String())
			}
		}
		return "ran out of memory"
	}
	s := fmt.Sprintf("exited with code %d", t.ExitCode)
	if t.Signal != 0 {
		s = fmt.Sprintf("was killed by signal %d", t.Signal)
	}
	if m := strings.TrimSpace(t.Message); m != "" {
		s += ": " + m
	}
	return s
}

func crashMessage(pod *corev1.Pod, cs *corev1.ContainerStatus) string {
	msg := "the notebook keeps crashing"
	if t := cs.LastTerminationState.Terminated; t != nil {
		msg += ": it " + exitText(pod, t)
	}
	return fmt.Sprintf("%s (%d restarts)", msg, cs.RestartCount)
}

func failedMessage(pod *corev1.Pod, cs *corev1.ContainerStatus) string {
	if pod.Status.Reason != "" {
		return withDetail(fmt.Sprintf("the notebook pod failed (%s)", pod.Status.Reason), strings.TrimSpace(pod.Status.Message))
	}
	if cs != nil && cs.State.Terminated != nil {
		return "the notebook " + exitText(pod, cs.State.Terminated)
	}
	return withDetail("the notebook pod failed", strings.TrimSpace(pod.Status.Message))
}
