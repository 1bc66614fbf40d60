// Package devcluster is the dev-mode stand-in for a Kubernetes cluster: a
// client-go fake clientset holding a namespace and GPU nodes, plus a loop
// that plays kubelet. It is SIMULATED: no container runs, no image is pulled,
// and pod IPs (10.88.x.y) route nowhere. Each new pod pinned to a known node
// moves through scheduled → pulling → started → Ready, one step per step
// delay, so a UI shows progress; a pod pinned to an unknown node is marked
// Unschedulable. Deleting a pod removes it at once (the fake has no grace
// period).
//
// It exists so that gpubroker-dev runs the whole spawn path in one process;
// tests of the real path use a real kube-apiserver (e2e).
package devcluster

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
)

// DefaultNamespace is the namespace New creates unless WithNamespace is given.
const DefaultNamespace = "gpubroker"

// DefaultStepDelay is the time between two simulated steps of a pod.
const DefaultStepDelay = 200 * time.Millisecond

// fieldManager is the field manager of the simulated kubelet's writes.
const fieldManager = "gpubroker-devcluster"

// Option configures a Cluster.
type Option func(*Cluster)

// WithNamespace sets the namespace created in the cluster; default
// DefaultNamespace.
func WithNamespace(ns string) Option { return func(c *Cluster) { c.namespace = ns } }

// WithStepDelay sets the time between simulated pod steps (> 0); default
// DefaultStepDelay.
func WithStepDelay(d time.Duration) Option {
	return func(c *Cluster) {
		if d > 0 {
			c.step = d
		}
	}
}

// Cluster is a simulated cluster. Create it with New, hand Clientset to the
// code under run, and call Run once. Safe for concurrent use.
type Cluster struct {
	cs        *fake.Clientset
	nodes     []string
	namespace string
	step      time.Duration
	log       *slog.Logger

	mu      sync.Mutex
	ips     map[types.UID]string // pod UID → simulated pod IP
	inUse   map[string]bool
	nextIP  int
	tracked map[string]bool // namespace/name of pods still moving
}

// New returns a simulated cluster with the given node names (each Ready,
// with 64 CPUs and 512 GiB), the namespace and its "default"
// ServiceAccount. Objects created through Clientset get a UID and a
// creation time, as from an API server. A nil log discards. New starts
// nothing.
func New(nodes []string, log *slog.Logger, opts ...Option) *Cluster {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &Cluster{
		nodes:     slices.Clone(nodes),
		namespace: DefaultNamespace,
		step:      DefaultStepDelay,
		log:       log,
		ips:       map[types.UID]string{},
		inUse:     map[string]bool{},
		tracked:   map[string]bool{},
	}
	for _, o := range opts {
		o(c)
	}
	objs := []runtime.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: c.namespace, UID: uuid.NewUUID(), CreationTimestamp: metav1.Now()}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: c.namespace, UID: uuid.NewUUID(), CreationTimestamp: metav1.Now()}},
	}
	for _, n := range c.nodes {
		objs = append(objs, node(n))
	}
	c.cs = fake.NewClientset(objs...)
	c.cs.PrependReactor("create", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if obj, ok := a.(k8stesting.CreateAction).GetObject().(metav1.Object); ok && obj.GetUID() == "" {
			obj.SetUID(uuid.NewUUID())
			obj.SetCreationTimestamp(metav1.Now())
		}
		return false, nil, nil
	})
	return c
}

func node(name string) *corev1.Node {
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("64"),
		corev1.ResourceMemory: resource.MustParse("512Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, UID: uuid.NewUUID(), CreationTimestamp: metav1.Now(),
			Labels: map[string]string{"kubernetes.io/hostname": name, "nvidia.com/gpu.present": "true", "gpubroker.io/simulated": "true"},
		},
		Status: corev1.NodeStatus{
			Capacity:    capacity,
			Allocatable: capacity,
			Conditions: []corev1.NodeCondition{{
				Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
				Message: "simulated by gpubroker-dev", LastTransitionTime: metav1.Now(),
			}},
		},
	}
}

// Clientset returns the simulated cluster's client.
func (c *Cluster) Clientset() kubernetes.Interface { return c.cs }

// Run plays kubelet for every pod until ctx is done, then stops its informer
// and returns nil once every goroutine it started has exited.
func (c *Cluster) Run(ctx context.Context) error {
	c.log.InfoContext(ctx, "SIMULATED cluster: no container runs; pods are moved to Running with fake IPs",
		"nodes", strings.Join(c.nodes, ","), "namespace", c.namespace)
	ctx, cancel := context.WithCancel(ctx)
	factory := informers.NewSharedInformerFactory(c.cs, 0)
	pods := factory.Core().V1().Pods()
	if _, err := pods.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.track(obj) },
		UpdateFunc: func(_, obj any) { c.track(obj) },
		DeleteFunc: func(obj any) { c.forget(obj) },
	}); err != nil {
		cancel()
		return fmt.Errorf("devcluster: add pod handler: %w", err)
	}
	defer func() {
		cancel()
		factory.Shutdown()
	}()
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), pods.Informer().HasSynced) {
		return nil
	}
	lister := pods.Lister()
	ticker := time.NewTicker(c.step)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
			c.advanceAll(ctx, lister)
		}
	}
}

// track remembers a pod that still has steps to go.
func (c *Cluster) track(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok || done(pod) {
		return
	}
	c.mu.Lock()
	c.tracked[pod.Namespace+"/"+pod.Name] = true
	c.mu.Unlock()
}

// forget releases a deleted pod's IP.
func (c *Cluster) forget(obj any) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.tracked, pod.Namespace+"/"+pod.Name)
	if ip, ok := c.ips[pod.UID]; ok {
		delete(c.inUse, ip)
		delete(c.ips, pod.UID)
	}
}

// done reports whether a pod needs no more simulated steps.
func done(pod *corev1.Pod) bool {
	if pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return true
	}
	for _, cond := range pod.Status.Conditions {
		if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
			return true
		}
		if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse {
			return true
		}
	}
	return false
}

func (c *Cluster) advanceAll(ctx context.Context, lister corelisters.PodLister) {
	c.mu.Lock()
	keys := make([]string, 0, len(c.tracked))
	for k := range c.tracked {
		keys = append(keys, k)
	}
	c.mu.Unlock()
	slices.Sort(keys)
	for _, key := range keys {
		ns, name, _ := strings.Cut(key, "/")
		cached, err := lister.Pods(ns).Get(name)
		if err != nil || done(cached) {
			c.mu.Lock()
			delete(c.tracked, key)
			c.mu.Unlock()
			continue
		}
		pod := cached.DeepCopy() // never modify the cache
		c.advance(pod)
		if _, err := c.cs.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{FieldManager: fieldManager}); err != nil {
			c.log.WarnContext(ctx, "simulated status update failed", "pod", key, "err", err)
		}
	}
}

// advance moves pod's status one simulated step forward.
func (c *Cluster) advance(pod *corev1.Pod) {
	now := metav1.Now()
	st := &pod.Status
	image := ""
	if len(pod.Spec.Containers) > 0 {
		image = pod.Spec.Containers[0].Image
	}
	statuses := func(state corev1.ContainerState, ready bool, imageID string) []corev1.ContainerStatus {
		out := make([]corev1.ContainerStatus, 0, len(pod.Spec.Containers))
		for _, ctr := range pod.Spec.Containers {
			started := state.Running != nil
			out = append(out, corev1.ContainerStatus{
				Name: ctr.Name, Image: ctr.Image, ImageID: imageID, State: state, Ready: ready, Started: &started,
			})
		}
		return out
	}
	switch {
	case len(st.Conditions) == 0: // step 1: bind to the node, start "pulling"
		if !slices.Contains(c.nodes, pod.Spec.NodeName) {
			st.Phase = corev1.PodPending
			st.Conditions = []corev1.PodCondition{{
				Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable, LastTransitionTime: now,
				Message: fmt.Sprintf("node %q is not part of the simulated cluster (nodes: %s)", pod.Spec.NodeName, strings.Join(c.nodes, ", ")),
			}}
			return
		}
		st.Phase = corev1.PodPending
		st.HostIP = "192.168.88.1"
		st.StartTime = &now
		st.Conditions = []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: corev1.ConditionFalse, Reason: "ContainersNotReady", LastTransitionTime: now},
			{Type: corev1.PodReady, Status: corev1.ConditionFalse, Reason: "ContainersNotReady", LastTransitionTime: now},
		}
		st.ContainerStatuses = statuses(corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{
			Reason: "ContainerCreating", Message: fmt.Sprintf("simulated pull of %s", image),
		}}, false, "")
	case st.PodIP == "": // step 2: container started, not ready yet
		ip := c.allocateIP(pod.UID)
		st.Phase = corev1.PodRunning
		st.PodIP = ip
		st.PodIPs = []corev1.PodIP{{IP: ip}}
		st.ContainerStatuses = statuses(corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}, false, "sha256:simulated")
	default: // step 3: ready
		for i := range st.Conditions {
			if t := st.Conditions[i].Type; t == corev1.PodReady || t == corev1.ContainersReady {
				st.Conditions[i] = corev1.PodCondition{Type: t, Status: corev1.ConditionTrue, LastTransitionTime: now}
			}
		}
		for i := range st.ContainerStatuses {
			st.ContainerStatuses[i].Ready = true
		}
	}
}

// allocateIP returns a unique IP in 10.88.0.0/16 for a pod, stable per UID.
func (c *Cluster) allocateIP(uid types.UID) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ip, ok := c.ips[uid]; ok {
		return ip
	}
	const hosts = 256 * 254 // 10.88.0.1 .. 10.88.255.254
	for range hosts {
		n := c.nextIP % hosts
		c.nextIP++
		ip := fmt.Sprintf("10.88.%d.%d", n/254, n%254+1)
		if !c.inUse[ip] {
			c.inUse[ip] = true
			c.ips[uid] = ip
			return ip
		}
	}
	return "" // more than 65,024 live pods: leave the pod without an IP
}
