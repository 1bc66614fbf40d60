package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/limiter/region"
)

// SliceInfo is one slice on this node, as its pod's annotations describe it
// (ARCHITECTURE.md invariant 2: pods are the durable record).
type SliceInfo struct {
	// ID is the slice id, the server's spawn id; it names the slice's
	// directory under the host root.
	ID        string
	PodUID    string
	Pod       string
	Namespace string
	// User and Server are the server's raw names (annotations); "" when
	// the pod does not say. Audit records carry them, so the broker can
	// tell the server's owner what the agent did.
	User, Server string
	// GPU is the UUID of the slice's GPU.
	GPU string
	// Initial is the slice as placed (annotations). The agent writes it as
	// the slice's first quota file when it first sees the pod, before the
	// broker sets a desired quota (the hook reads nothing else).
	Initial v1.Slice
	// Sharing is the server's sharing mode (sliced for pods without the
	// annotation); for mig, GPU is the MIG instance's uuid and Parent its
	// GPU's.
	Sharing v1.SharingMode
	Parent  string
}

// quota is the quota file of slice s with slice sl: the slice itself for a
// sliced server; for the other modes the memory cap with compute 100/100,
// which the hook does not pace (a MIG instance and a whole GPU are the
// server's own; an MPS client's SMs are capped by MPS itself, see mps.go).
func (s SliceInfo) quota(sl v1.Slice) region.Quota {
	q := region.Quota{
		SliceID:             s.ID,
		MemoryLimitBytes:    uint64(max(sl.MemoryMiB, 0)) * mib,
		ComputePercent:      uint32(max(sl.ComputePercent, 0)),
		ComputeLimitPercent: uint32(max(sl.ComputeLimitPercent, 0)),
	}
	if s.Sharing != "" && s.Sharing != v1.SharingSliced {
		q.ComputePercent, q.ComputeLimitPercent = 100, 100
	}
	if _, err := region.ParseUUID(s.GPU); err == nil {
		q.GPUUUID = s.GPU
	}
	return q
}

// sliceIDPattern is what a slice id must look like to be used as a
// directory name: no '/', no leading '.', at most 63 bytes.
var sliceIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// ErrBadPod is returned (wrapped) for a managed pod whose annotations do not
// describe a usable slice.
var ErrBadPod = errors.New("agent: pod does not describe a slice")

// SliceFromPod reads a notebook pod's slice annotations. Every problem is
// reported at once, wrapping ErrBadPod.
func SliceFromPod(p *corev1.Pod) (SliceInfo, error) {
	a := p.Annotations
	var errs []error
	num := func(key string) int64 {
		n, err := strconv.ParseInt(a[key], 10, 64)
		if err != nil {
			errs = append(errs, fmt.Errorf("annotation %s: %w", key, err))
		}
		return n
	}
	s := SliceInfo{
		ID:        a[v1.AnnotationSpawnID],
		PodUID:    string(p.UID),
		Pod:       p.Name,
		Namespace: p.Namespace,
		User:      a[v1.AnnotationUser],
		Server:    a[v1.AnnotationServer],
		GPU:       a[v1.AnnotationGPUUUID],
		Sharing:   v1.SharingMode(a[v1.AnnotationSharing]),
		Parent:    a[v1.AnnotationParentUUID],
		Initial: v1.Slice{
			MemoryMiB:           num(v1.AnnotationMemoryMiB),
			ComputePercent:      int(num(v1.AnnotationComputePercent)),
			ComputeLimitPercent: int(num(v1.AnnotationComputeLimitPercent)),
		},
	}
	if !sliceIDPattern.MatchString(s.ID) {
		errs = append(errs, fmt.Errorf("annotation %s %q is not a usable slice id", v1.AnnotationSpawnID, s.ID))
	}
	if s.GPU == "" {
		errs = append(errs, fmt.Errorf("annotation %s is empty", v1.AnnotationGPUUUID))
	}
	switch {
	case s.Sharing == "":
		s.Sharing = v1.SharingSliced
	case !s.Sharing.Valid():
		errs = append(errs, fmt.Errorf("annotation %s %q is not a sharing mode", v1.AnnotationSharing, s.Sharing))
	}
	if s.PodUID == "" {
		errs = append(errs, errors.New("pod has no uid"))
	}
	if err := errors.Join(errs...); err != nil {
		return SliceInfo{}, fmt.Errorf("%w: pod %s/%s: %w", ErrBadPod, p.Namespace, p.Name, err)
	}
	return s, nil
}

// StaticPods is a fixed PodIndex, for tests and for running the agent
// without Kubernetes. The zero value is empty. Not safe for concurrent
// modification; build it before use.
type StaticPods []SliceInfo

// Slices returns the slices.
func (s StaticPods) Slices() []SliceInfo { return slices.Clone(s) }

// Synced is always true: the list is complete by construction.
func (s StaticPods) Synced() bool { return true }

// Changed is nil: the list never changes.
func (s StaticPods) Changed() <-chan struct{} { return nil }

// ByPodUID returns the slice of the pod with uid.
func (s StaticPods) ByPodUID(uid string) (SliceInfo, bool) {
	for _, x := range s {
		if x.PodUID == uid {
			return x, true
		}
	}
	return SliceInfo{}, false
}

// PodWatcher keeps the slices of the gpubroker pods on one node, from a
// client-go informer restricted to spec.nodeName=<node> and the managed-by
// label, in one namespace or in all (WithNamespace). Its methods are safe
// for concurrent use; until Run has synced its cache they report no slices.
type PodWatcher struct {
	client    kubernetes.Interface
	node      string
	namespace string // "": every namespace
	resync    time.Duration
	log       func(err error)

	mu      sync.RWMutex
	byUID   map[string]SliceInfo
	synced  bool
	changed chan struct{} // one pending notice that a slice appeared or changed
}

// PodWatcherOption configures a PodWatcher.
type PodWatcherOption func(*PodWatcher)

// WithNamespace watches only the pods of namespace (the broker's notebook
// namespace), so that the agent needs a Role there and no ClusterRole; ""
// (the default) watches every namespace.
func WithNamespace(namespace string) PodWatcherOption {
	return func(w *PodWatcher) { w.namespace = namespace }
}

// NewPodWatcher returns a watcher of node's gpubroker pods. bad is called
// for each pod whose annotations are unusable (nil: ignored). It does no I/O.
func NewPodWatcher(client kubernetes.Interface, node string, bad func(err error), opts ...PodWatcherOption) *PodWatcher {
	if bad == nil {
		bad = func(error) {}
	}
	w := &PodWatcher{client: client, node: node, resync: 10 * time.Minute, log: bad, byUID: map[string]SliceInfo{},
		changed: make(chan struct{}, 1)}
	for _, o := range opts {
		o(w)
	}
	return w
}

// Run runs the informer until ctx ends; it returns an error when the cache
// cannot sync, and nil after ctx ends.
func (w *PodWatcher) Run(ctx context.Context) error {
	f := informers.NewSharedInformerFactoryWithOptions(w.client, w.resync,
		informers.WithNamespace(w.namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", w.node).String()
			o.LabelSelector = labels.SelectorFromSet(labels.Set{v1.LabelManagedBy: v1.ManagedByValue}).String()
		}))
	inf := f.Core().V1().Pods().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { w.upsert(obj) },
		UpdateFunc: func(_, obj any) { w.upsert(obj) },
		DeleteFunc: w.remove,
	}); err != nil {
		return fmt.Errorf("pod watcher: %w", err)
	}
	f.Start(ctx.Done())
	defer f.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		if ctx.Err() != nil {
			return nil
		}
		return errors.New("pod watcher: cache did not sync")
	}
	w.mu.Lock()
	w.synced = true
	w.mu.Unlock()
	<-ctx.Done()
	return nil
}

// Synced reports whether the informer cache has synced.
func (w *PodWatcher) Synced() bool {
	w.mu.RLock()
	defer w.mu.RUnlock()
	return w.synced
}

func (w *PodWatcher) upsert(obj any) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	// The field selector already restricts the watch to this node; the
	// check keeps the index right if a selector is ever dropped.
	if p.Spec.NodeName != w.node || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		w.removeUID(string(p.UID))
		return
	}
	s, err := SliceFromPod(p)
	if err != nil {
		w.log(err)
		w.removeUID(string(p.UID))
		return
	}
	w.mu.Lock()
	old, had := w.byUID[s.PodUID]
	w.byUID[s.PodUID] = s
	w.mu.Unlock()
	if !had || old != s {
		select {
		case w.changed <- struct{}{}:
		default: // a notice is already pending; the reader sees every slice
		}
	}
}

// Changed receives a value after a slice appeared or changed; one pending
// notice covers any number of changes. The agent prepares new slices'
// directories and first quota files on it, before their containers start.
func (w *PodWatcher) Changed() <-chan struct{} { return w.changed }

func (w *PodWatcher) remove(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if p, ok := obj.(*corev1.Pod); ok {
		w.removeUID(string(p.UID))
	}
}

func (w *PodWatcher) removeUID(uid string) {
	w.mu.Lock()
	delete(w.byUID, uid)
	w.mu.Unlock()
}

// Slices returns the node's slices, sorted by id.
func (w *PodWatcher) Slices() []SliceInfo {
	w.mu.RLock()
	out := make([]SliceInfo, 0, len(w.byUID))
	for _, s := range w.byUID {
		out = append(out, s)
	}
	w.mu.RUnlock()
	slices.SortFunc(out, func(a, b SliceInfo) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// ByPodUID returns the slice of the pod with uid.
func (w *PodWatcher) ByPodUID(uid string) (SliceInfo, bool) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	s, ok := w.byUID[uid]
	return s, ok
}
