package spawner

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

// ManagedPod is what the spawner reads back from a notebook pod: the durable
// record of a server's spawn and slice (ARCHITECTURE.md invariant 2) plus its state.
type ManagedPod struct {
	// Name is the pod name.
	Name string
	// User, Server, Profile are the raw names from the annotations.
	User, Server, Profile string
	// SpawnID is the spawn (and slice) id.
	SpawnID string
	// Node and GPUUUID locate the slice's GPU.
	Node, GPUUUID string
	// Slice is the share of the GPU the pod holds.
	Slice v1.Slice
	// Sharing is the pod's sharing mode (sliced for pods made before modes
	// existed); MIGProfile and ParentUUID describe a MIG server's instance.
	Sharing                v1.SharingMode
	MIGProfile, ParentUUID string
	// QuotaGroups are the raw groups charged; nil when none.
	QuotaGroups []string
	// IdempotencyKey is the key of the create that started the spawn; ""
	// when none.
	IdempotencyKey string
	// Phase and Message are Classify's reading; ParsePod leaves them empty,
	// Client.Pods fills them.
	Phase   Phase
	Message string
	// URL is http://<podIP>:<port> once the pod has an IP, else "".
	URL string
	// CreatedAt is the pod's creation time.
	CreatedAt time.Time
	// Deleting is true once the pod's deletion has been requested.
	Deleting bool
	// Held is true while the pod carries v1.FinalizerServerRecord: once it
	// has ended (Phase PhaseGone while the pod is still listed) it stays
	// until the broker records its server's end and calls
	// Client.ReleasePod.
	Held bool
	// Ran is true once the notebook container has started at least once
	// (its status is or was running).
	Ran bool
	// Err is set by Client.Pods when the pod's annotations could not be read
	// (ParsePod's error); the other fields then hold what could be read.
	Err error
}

// ParsePod reads a notebook pod's annotations back into a ManagedPod. It is
// the inverse of Pod for the identity and slice fields. The error names every
// missing or unreadable annotation; a pod not labelled managed-by=gpubroker
// is an error wrapping ErrNotOwned. Phase and Message are left empty.
func ParsePod(pod *corev1.Pod) (ManagedPod, error) {
	if pod == nil {
		return ManagedPod{}, errors.New("parse pod: nil pod")
	}
	if pod.Labels[v1.LabelManagedBy] != v1.ManagedByValue {
		return ManagedPod{Name: pod.Name}, fmt.Errorf("parse pod %s: %w", pod.Name, ErrNotOwned)
	}
	a := pod.Annotations
	var errs []error
	get := func(key string, required bool) string {
		v, ok := a[key]
		if !ok || required && v == "" {
			errs = append(errs, fmt.Errorf("annotation %s is missing", key))
		}
		return v
	}
	number := func(key string) int64 {
		s := get(key, true)
		if s == "" {
			return 0
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			errs = append(errs, fmt.Errorf("annotation %s=%q is not an integer", key, s))
		}
		return n
	}
	m := ManagedPod{
		Name:      pod.Name,
		User:      get(v1.AnnotationUser, true),
		Server:    get(v1.AnnotationServer, false),
		Profile:   get(v1.AnnotationProfile, false),
		SpawnID:   get(v1.AnnotationSpawnID, true),
		Node:      get(v1.AnnotationNode, true),
		GPUUUID:   get(v1.AnnotationGPUUUID, true),
		URL:       URL(pod),
		CreatedAt: pod.CreationTimestamp.Time,
		Deleting:  pod.DeletionTimestamp != nil,
		Held:      slices.Contains(pod.Finalizers, v1.FinalizerServerRecord),
		Ran:       ran(pod),
		Slice: v1.Slice{
			MemoryMiB:           number(v1.AnnotationMemoryMiB),
			ComputePercent:      int(number(v1.AnnotationComputePercent)),
			ComputeLimitPercent: int(number(v1.AnnotationComputeLimitPercent)),
		},
	}
	if g := a[v1.AnnotationGroups]; g != "" {
		m.QuotaGroups = strings.Split(g, ",")
	}
	m.Sharing = v1.SharingMode(a[v1.AnnotationSharing])
	switch {
	case m.Sharing == "":
		m.Sharing = v1.SharingSliced
	case !m.Sharing.Valid():
		errs = append(errs, fmt.Errorf("annotation %s=%q is not a sharing mode", v1.AnnotationSharing, m.Sharing))
	case m.Sharing == v1.SharingMIG:
		m.MIGProfile = get(v1.AnnotationMIGProfile, true)
		m.ParentUUID = get(v1.AnnotationParentUUID, true)
	}
	m.IdempotencyKey = a[v1.AnnotationIdempotencyKey]
	if l := pod.Labels[v1.LabelSpawnID]; m.SpawnID != "" && l != m.SpawnID {
		errs = append(errs, fmt.Errorf("label %s=%q disagrees with annotation %s=%q", v1.LabelSpawnID, l, v1.AnnotationSpawnID, m.SpawnID))
	}
	if len(errs) > 0 {
		return m, fmt.Errorf("parse pod %s: %w", pod.Name, errors.Join(errs...))
	}
	return m, nil
}

// ran reports whether pod's notebook container has started at least once:
// it runs, or ran before it terminated or restarted.
func ran(pod *corev1.Pod) bool {
	cs := notebookStatus(pod)
	if cs == nil {
		return false
	}
	t := cs.State.Terminated
	return cs.State.Running != nil || cs.RestartCount > 0 || cs.LastTerminationState.Terminated != nil ||
		t != nil && !t.StartedAt.IsZero()
}
