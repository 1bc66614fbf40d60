package spawner

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

var t0 = time.Date(2026, 11, 29, 14, 0, 0, 0, time.UTC)

// statusPod returns the test pod created at t0 with the given status.
func statusPod(t *testing.T, st corev1.PodStatus) *corev1.Pod {
	t.Helper()
	pod, err := Pod(testConfig(), testSpec())
	if err != nil {
		t.Fatal(err)
	}
	pod.CreationTimestamp = metav1.NewTime(t0)
	pod.Status = st
	return pod
}

func cond(typ corev1.PodConditionType, status corev1.ConditionStatus, at time.Time, reason, msg string) corev1.PodCondition {
	return corev1.PodCondition{Type: typ, Status: status, LastTransitionTime: metav1.NewTime(at), Reason: reason, Message: msg}
}

func waiting(reason, msg string, restarts int32) []corev1.ContainerStatus {
	return []corev1.ContainerStatus{{
		Name: ContainerName, RestartCount: restarts,
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: msg}},
	}}
}

func TestClassify(t *testing.T) {
	scheduled := cond(corev1.PodScheduled, corev1.ConditionTrue, t0.Add(time.Second), "", "")
	running := []corev1.ContainerStatus{{
		Name: ContainerName, Ready: true, ImageID: "sha256:abc",
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(t0.Add(5 * time.Second))}},
	}}
	deleting := statusPod(t, corev1.PodStatus{Phase: corev1.PodRunning})
	deleting.DeletionTimestamp = ptr(metav1.NewTime(t0.Add(time.Minute)))
	noCreation := statusPod(t, corev1.PodStatus{Phase: corev1.PodPending})
	noCreation.CreationTimestamp = metav1.Time{}

	tests := []struct {
		name      string
		pod       *corev1.Pod
		at        time.Duration // since t0
		wantPhase Phase
		wantMsg   string
	}{
		{name: "nil pod is gone", pod: nil, wantPhase: PhaseGone, wantMsg: "the notebook pod is gone"},
		{name: "fresh pod waits for its node", pod: statusPod(t, corev1.PodStatus{Phase: corev1.PodPending}), at: time.Second,
			wantPhase: PhasePending, wantMsg: "waiting for node gpu-1"},
		{name: "node never starts the pod", pod: statusPod(t, corev1.PodStatus{Phase: corev1.PodPending}), at: 5 * time.Minute,
			wantPhase: PhaseFailed, wantMsg: "node gpu-1 did not start the notebook within 5m0s"},
		{name: "missing creation time never times out", pod: noCreation, at: time.Hour,
			wantPhase: PhasePending, wantMsg: "waiting for node gpu-1"},
		{name: "unschedulable within deadline", pod: statusPod(t, corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{
			cond(corev1.PodScheduled, corev1.ConditionFalse, t0, "Unschedulable", "0/3 nodes are available: 3 Insufficient memory."),
		}}), at: time.Minute, wantPhase: PhasePending, wantMsg: "waiting for a node: 0/3 nodes are available: 3 Insufficient memory."},
		{name: "unschedulable past deadline", pod: statusPod(t, corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{
			cond(corev1.PodScheduled, corev1.ConditionFalse, t0, "Unschedulable", "0/3 nodes are available: 3 Insufficient memory."),
		}}), at: 5 * time.Minute, wantPhase: PhaseFailed,
			wantMsg: "the notebook could not be scheduled for 5m0s: 0/3 nodes are available: 3 Insufficient memory."},
		{name: "pulling image", pod: statusPod(t, corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{scheduled},
			ContainerStatuses: waiting("ContainerCreating", "", 0)}), at: 10 * time.Second,
			wantPhase: PhaseStarting, wantMsg: "pulling image quay.io/jupyter/minimal-notebook:2024-10-07 on node gpu-1"},
		{name: "invalid image fails at once", pod: statusPod(t, corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{scheduled},
			ContainerStatuses: waiting("InvalidImageName", `couldn't parse image name "UPPER:x"`, 0)}), at: 2 * time.Second,
			wantPhase: PhaseFailed, wantMsg: `cannot use image quay.io/jupyter/minimal-notebook:2024-10-07: couldn't parse image name "UPPER:x"`},
		{name: "pull error within grace retries", pod: statusPod(t, corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{scheduled},
			ContainerStatuses: waiting("ErrImagePull", "manifest unknown", 0)}), at: 30 * time.Second,
			wantPhase: PhaseStarting, wantMsg: "pulling image quay.io/jupyter/minimal-notebook:2024-10-07 on node gpu-1 (retrying): manifest unknown"},
		{name: "pull backoff past grace fails", pod: statusPod(t, corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{scheduled},
			ContainerStatuses: waiting("ImagePullBackOff", `Back-off pulling image "x"`, 0)}), at: 91 * time.Second,
			wantPhase: PhaseFailed, wantMsg: `could not pull image quay.io/jupyter/minimal-notebook:2024-10-07 on node gpu-1: Back-off pulling image "x"`},
		{name: "config error within grace", pod: statusPod(t, corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{scheduled},
			ContainerStatuses: waiting("CreateContainerConfigError", `secret "nb-alice-env" not found`, 0)}), at: 10 * time.Second,
			wantPhase: PhaseStarting, wantMsg: `starting the notebook container (retrying): secret "nb-alice-env" not found`},
		{name: "config error past grace fails", pod: statusPod(t, corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{scheduled},
			ContainerStatuses: waiting("CreateContainerConfigError", `secret "nb-alice-env" not found`, 0)}), at: 2 * time.Minute,
			wantPhase: PhaseFailed, wantMsg: `could not start the notebook container: secret "nb-alice-env" not found`},
		{name: "crash loop fails at once", pod: statusPod(t, corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{scheduled},
			ContainerStatuses: []corev1.ContainerStatus{{
				Name: ContainerName, RestartCount: 3,
				State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
				LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error"}},
			}}}), at: time.Minute,
			wantPhase: PhaseFailed, wantMsg: "the notebook keeps crashing: it exited with code 1 (3 restarts)"},
		{name: "oom crash loop names the limit", pod: statusPod(t, corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{scheduled},
			ContainerStatuses: []corev1.ContainerStatus{{
				Name: ContainerName, RestartCount: 2,
				State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
				LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "OOMKilled"}},
			}}}), at: time.Minute,
			wantPhase: PhaseFailed, wantMsg: "the notebook keeps crashing: it ran out of memory (limit 4Gi) (2 restarts)"},
		{name: "terminated and restarting", pod: statusPod(t, corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{scheduled},
			ContainerStatuses: []corev1.ContainerStatus{{Name: ContainerName, RestartCount: 1,
				State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 2}}}}}), at: time.Minute,
			wantPhase: PhaseStarting, wantMsg: "the notebook exited with code 2; restarting"},
		{name: "running but not ready", pod: statusPod(t, corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.88.0.5",
			Conditions:        []corev1.PodCondition{scheduled, cond(corev1.PodReady, corev1.ConditionFalse, t0.Add(time.Second), "ContainersNotReady", "")},
			ContainerStatuses: []corev1.ContainerStatus{{Name: ContainerName, State: running[0].State}}}), at: 6 * time.Second,
			wantPhase: PhaseStarting, wantMsg: "the notebook is starting on node gpu-1"},
		{name: "ready with ip is running", pod: statusPod(t, corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.88.0.5",
			Conditions:        []corev1.PodCondition{scheduled, cond(corev1.PodReady, corev1.ConditionTrue, t0.Add(6*time.Second), "", "")},
			ContainerStatuses: running}), at: 10 * time.Second,
			wantPhase: PhaseRunning, wantMsg: "running on node gpu-1"},
		{name: "ready without ip is still starting", pod: statusPod(t, corev1.PodStatus{Phase: corev1.PodRunning,
			Conditions:        []corev1.PodCondition{scheduled, cond(corev1.PodReady, corev1.ConditionTrue, t0.Add(6*time.Second), "", "")},
			ContainerStatuses: running}), at: 10 * time.Second,
			wantPhase: PhaseStarting, wantMsg: "the notebook is starting on node gpu-1"},
		{name: "node not responding briefly", pod: statusPod(t, corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.88.0.5",
			Conditions:        []corev1.PodCondition{scheduled, cond(corev1.PodReady, corev1.ConditionFalse, t0.Add(time.Hour), "", "")},
			ContainerStatuses: running}), at: time.Hour + time.Minute,
			wantPhase: PhaseRunning, wantMsg: "running on node gpu-1, which is not responding"},
		{name: "node lost past deadline", pod: statusPod(t, corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.88.0.5",
			Conditions:        []corev1.PodCondition{scheduled, cond(corev1.PodReady, corev1.ConditionFalse, t0.Add(time.Hour), "", "")},
			ContainerStatuses: running}), at: time.Hour + 6*time.Minute,
			wantPhase: PhaseFailed, wantMsg: "node gpu-1 stopped responding 6m0s ago"},
		{name: "NodeLost reason fails", pod: statusPod(t, corev1.PodStatus{Phase: corev1.PodRunning, Reason: "NodeLost"}), at: time.Hour,
			wantPhase: PhaseFailed, wantMsg: "lost contact with node gpu-1"},
		{name: "unknown phase fails", pod: statusPod(t, corev1.PodStatus{Phase: corev1.PodUnknown}), at: time.Hour,
			wantPhase: PhaseFailed, wantMsg: "lost contact with node gpu-1"},
		{name: "evicted", pod: statusPod(t, corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Evicted", Message: "The node was low on resource: memory."}), at: time.Hour,
			wantPhase: PhaseFailed, wantMsg: "the notebook pod failed (Evicted): The node was low on resource: memory."},
		{name: "failed with exit code", pod: statusPod(t, corev1.PodStatus{Phase: corev1.PodFailed,
			ContainerStatuses: []corev1.ContainerStatus{{Name: ContainerName,
				State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 3, Message: "bad config"}}}}}), at: time.Hour,
			wantPhase: PhaseFailed, wantMsg: "the notebook exited with code 3: bad config"},
		{name: "succeeded means the notebook exited", pod: statusPod(t, corev1.PodStatus{Phase: corev1.PodSucceeded}), at: time.Hour,
			wantPhase: PhaseFailed, wantMsg: "the notebook exited"},
		{name: "deleting is stopping", pod: deleting, at: time.Hour,
			wantPhase: PhaseStopping, wantMsg: "the notebook is shutting down"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			phase, msg := Classify(tc.pod, t0.Add(tc.at), Config{})
			if diff := cmp.Diff([2]string{string(tc.wantPhase), tc.wantMsg}, [2]string{string(phase), msg}); diff != "" {
				t.Errorf("Classify (-want +got):\n%s", diff)
			}
		})
	}
}

func TestURL(t *testing.T) {
	tests := []struct {
		name string
		ip   string
		want string
	}{
		{name: "no ip", ip: "", want: ""},
		{name: "ipv4", ip: "10.88.0.9", want: "http://10.88.0.9:8888"},
		{name: "ipv6", ip: "fd00::9", want: "http://[fd00::9]:8888"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pod := statusPod(t, corev1.PodStatus{PodIP: tc.ip})
			if diff := cmp.Diff(tc.want, URL(pod)); diff != "" {
				t.Errorf("URL (-want +got):\n%s", diff)
			}
		})
	}
}
