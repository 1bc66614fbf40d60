package spawner

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

// DefaultResync is how often Run re-classifies every cached pod, so that
// deadline-based failures fire without a new pod update.
const DefaultResync = 5 * time.Second

// PodEvent is a change in a notebook pod's phase or message. Events of one
// pod incarnation are keyed by its spawn id, so an event of an old spawn can
// always be told from the current one.
type PodEvent struct {
	// User, Server are the raw names; SpawnID the spawn the pod belongs to.
	// They are "" when the pod's annotations are unreadable (see
	// ManagedPod.Err).
	User, Server, SpawnID string
	// Pod is the pod name.
	Pod string
	// Phase is Classify's reading; PhaseGone once the pod is deleted.
	Phase Phase
	// Message is a sentence for the user.
	Message string
	// URL is http://<podIP>:<port>, set only when Phase is PhaseRunning.
	URL string
	// Held is true when the pod is still there, carrying
	// v1.FinalizerServerRecord (see ManagedPod.Held): with PhaseGone, the
	// pod has ended and waits for Client.ReleasePod.
	Held bool
}

// Run watches the namespace's pods labelled managed-by=gpubroker, delivers
// PodEvents to subscribers and re-classifies every pod each resync period.
// It blocks until ctx is done, then stops the informers and waits for every
// goroutine it started; it returns nil after a normal stop, or an error for
// an invalid config or a second call.
func (c *Client) Run(ctx context.Context) error {
	if err := c.cfg.Validate(); err != nil {
		return fmt.Errorf("spawner: config: %w", err)
	}
	select {
	case <-c.started:
		return errors.New("spawner: Run called twice")
	default:
		close(c.started)
	}
	ctx, cancel := context.WithCancel(ctx)
	factory := informers.NewSharedInformerFactoryWithOptions(c.cs, 0,
		informers.WithNamespace(c.cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = owned().String()
		}),
	)
	pods := factory.Core().V1().Pods()
	informer := pods.Informer()
	reg, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.observe(obj, false) },
		UpdateFunc: func(_, obj any) { c.observe(obj, false) },
		DeleteFunc: func(obj any) { c.observe(obj, true) },
	})
	if err != nil {
		cancel()
		return fmt.Errorf("spawner: add pod handler: %w", err)
	}
	var wg sync.WaitGroup
	defer func() {
		c.mu.Lock()
		c.lister = nil // the cache is no longer maintained: reads fail again
		c.mu.Unlock()
		cancel()
		factory.Shutdown() // waits for the informer goroutines
		wg.Wait()
	}()
	factory.Start(ctx.Done())
	wg.Go(func() { c.dispatch(ctx) })

	if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced, reg.HasSynced) {
		return nil // ctx ended before the sync
	}
	c.mu.Lock()
	c.lister = pods.Lister()
	c.mu.Unlock()
	close(c.syncedCh)
	c.log.InfoContext(ctx, "spawner cache synced")

	ticker := time.NewTicker(c.resync)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
			c.reclassify()
		}
	}
}

// Synced reports whether the pod cache has synced and Run is still
// maintaining it; reads succeed exactly then.
func (c *Client) Synced() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lister != nil
}

// WaitSynced blocks until the cache has first synced or ctx is done; the
// error then wraps ErrNotSynced and ctx's error.
func (c *Client) WaitSynced(ctx context.Context) error {
	select {
	case <-c.syncedCh:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", ErrNotSynced, ctx.Err())
	}
}

// Subscribe calls fn with every PodEvent from now until ctx is done. Calls
// come one at a time, in order, from Run's dispatcher goroutine; fn must not
// block for long and must not call Subscribe. Consecutive identical events of
// a pod are delivered once, and a burst of changes may be coalesced into the
// latest one, so a subscriber that needs the current state of every pod reads
// Pods after subscribing.
func (c *Client) Subscribe(ctx context.Context, fn func(PodEvent)) {
	c.mu.Lock()
	id := c.nextSub
	c.nextSub++
	c.subs[id] = fn
	c.mu.Unlock()
	context.AfterFunc(ctx, func() {
		c.mu.Lock()
		delete(c.subs, id)
		c.mu.Unlock()
	})
}

// Pods returns every cached notebook pod, sorted by name, with Phase and
// Message filled by Classify at the client's clock; URL is kept only for
// running pods. A pod whose annotations cannot be read is included with Err
// set and what could be read. Before the cache has synced, and after Run has
// returned, the error wraps ErrNotSynced.
func (c *Client) Pods() ([]ManagedPod, error) {
	c.mu.Lock()
	lister := c.lister
	c.mu.Unlock()
	if lister == nil {
		return nil, fmt.Errorf("list pods: %w", ErrNotSynced)
	}
	objs, err := lister.Pods(c.cfg.Namespace).List(labels.SelectorFromSet(owned()))
	if err != nil {
		return nil, fmt.Errorf("list pods: %w", err)
	}
	now := c.now()
	out := make([]ManagedPod, 0, len(objs))
	for _, pod := range objs {
		m, err := c.managed(pod, now)
		m.Err = err
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b ManagedPod) int { return cmp.Compare(a.Name, b.Name) })
	return out, nil
}

// ListPods is Pods read from the API server itself instead of the cache:
// a list at the newest resourceVersion (a quorum read), so it holds every
// managed pod the API server has accepted, including those the cache has
// not caught up with yet (a watch that broke with an API server restart
// and is backing off). The reconciler calls it before it acts on a pod
// being absent from the cache, and before it reopens placement after Redis
// lost its data. Transient errors are retried (see Transient).
func (c *Client) ListPods(ctx context.Context) ([]ManagedPod, error) {
	var list *corev1.PodList
	err := c.retry(ctx, "list pods", func(ctx context.Context) error {
		var err error
		list, err = c.cs.CoreV1().Pods(c.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: owned().String()})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list pods: %w", err)
	}
	now := c.now()
	out := make([]ManagedPod, 0, len(list.Items))
	for i := range list.Items {
		pod := &list.Items[i]
		if pod.Labels[v1.LabelManagedBy] != v1.ManagedByValue {
			continue // a label selector the server ignored must not widen what we touch
		}
		m, err := c.managed(pod, now)
		m.Err = err
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b ManagedPod) int { return cmp.Compare(a.Name, b.Name) })
	return out, nil
}

// managed reads pod as ParsePod does, classified at now (no URL unless it
// runs); the error is ParsePod's, with what could be read.
func (c *Client) managed(pod *corev1.Pod, now time.Time) (ManagedPod, error) {
	m, err := ParsePod(pod)
	m.Phase, m.Message = Classify(pod, now, c.cfg)
	if m.Phase != PhaseRunning {
		m.URL = ""
	}
	return m, err
}

// HasPod reports whether the pod of spawn spawnID of server (user, server)
// is there and has not Ended (one that has is there only for its
// finalizer): a managed pod named PodName(user, server) whose annotations
// name that user, server and spawn, as a pod Pods lists with those User,
// Server and SpawnID. The cache answers when it holds a pod of that name
// (one lookup by name, not a listing of every pod). When it holds none,
// the API server is asked (one GET): the cache may lag it (a pod created
// moments ago, or a watch that is re-establishing after an API server
// restart), and a caller that frees a slice on "no pod" must not do so
// while the pod runs. The error wraps ErrNotSynced before the cache has
// synced and after Run has returned; errors of the GET are the API
// server's (callers count an error as present).
func (c *Client) HasPod(ctx context.Context, user, server, spawnID string) (bool, error) {
	c.mu.Lock()
	lister := c.lister
	c.mu.Unlock()
	if lister == nil {
		return false, fmt.Errorf("find pod: %w", ErrNotSynced)
	}
	name := PodName(user, server)
	pod, err := lister.Pods(c.cfg.Namespace).Get(name)
	if apierrors.IsNotFound(err) {
		pod, err = c.cs.CoreV1().Pods(c.cfg.Namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, apiError("find pod", name, err)
		}
	} else if err != nil {
		return false, fmt.Errorf("find pod: %w", err)
	}
	a := pod.Annotations
	return !Ended(pod) && pod.Labels[v1.LabelManagedBy] == v1.ManagedByValue &&
		a[v1.AnnotationUser] == user && a[v1.AnnotationServer] == server && a[v1.AnnotationSpawnID] == spawnID, nil
}

// PodBySlugs returns the cached pod whose user and server labels are
// userSlug and serverSlug (the path segments of BaseURL), classified as
// Pods does; ok is false when there is none. The error wraps ErrNotSynced
// before the cache has synced.
func (c *Client) PodBySlugs(userSlug, serverSlug string) (ManagedPod, bool, error) {
	c.mu.Lock()
	lister := c.lister
	c.mu.Unlock()
	if lister == nil {
		return ManagedPod{}, false, fmt.Errorf("find pod: %w", ErrNotSynced)
	}
	set := owned()
	set[v1.LabelUser], set[v1.LabelServer] = userSlug, serverSlug
	sel := labels.SelectorFromSet(set)
	objs, err := lister.Pods(c.cfg.Namespace).List(sel)
	if err != nil {
		return ManagedPod{}, false, fmt.Errorf("find pod: %w", err)
	}
	for _, pod := range objs {
		if pod.Name != PodName(pod.Annotations[v1.AnnotationUser], pod.Annotations[v1.AnnotationServer]) {
			continue // labels that do not match the raw names: not the server's pod
		}
		m, err := c.managed(pod, c.now())
		if err != nil {
			continue
		}
		return m, true, nil
	}
	return ManagedPod{}, false, nil
}

// NotebookPrefix returns the path prefix of the running notebook of spawn
// spawnID of (user, server), read from its cached pod: JupyterHub's
// JUPYTERHUB_SERVICE_PREFIX when the hub started it (hub is then true: the
// notebook takes tokens the hub issued, such as HubServerToken, not the
// spawn's notebook token), else v1.EnvBaseURL. ok is false when the cache
// has no such pod, or when the prefix is not a plain absolute path
// (pathOnly): only the hub may set JUPYTERHUB_* variables, but the
// prefix is appended to the pod's address and must not name another host.
func (c *Client) NotebookPrefix(user, server, spawnID string) (prefix string, hub, ok bool) {
	c.mu.Lock()
	lister := c.lister
	c.mu.Unlock()
	if lister == nil {
		return "", false, false
	}
	pod, err := lister.Pods(c.cfg.Namespace).Get(PodName(user, server))
	if err != nil || spawnOf(pod) != spawnID {
		return "", false, false
	}
	for _, ctr := range pod.Spec.Containers {
		if ctr.Name != ContainerName {
			continue
		}
		base := ""
		for _, e := range ctr.Env {
			switch e.Name {
			case "JUPYTERHUB_SERVICE_PREFIX":
				return e.Value, true, pathOnly(e.Value)
			case v1.EnvBaseURL:
				base = e.Value
			}
		}
		return base, false, base != "" && pathOnly(base)
	}
	return "", false, false
}

// pathOnly reports whether p is an absolute URL path and nothing more: a
// prefix appended to a pod's address must not name another host
// ("@evil/", "//evil/") or carry a query, fragment or backslash.
func pathOnly(p string) bool {
	if !strings.HasPrefix(p, "/") || strings.HasPrefix(p, "//") || strings.ContainsAny(p, "@?#\\ ") {
		return false
	}
	u, err := url.Parse(p)
	return err == nil && u.Scheme == "" && u.Host == "" && u.User == nil
}

// observe turns an informer notification into a queued event. It never
// blocks and never modifies the cached object.
func (c *Client) observe(obj any, deleted bool) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj, deleted = tomb.Obj, true
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok || pod.Labels[v1.LabelManagedBy] != v1.ManagedByValue || pod.Namespace != c.cfg.Namespace {
		return
	}
	c.enqueue(pod, deleted)
}

func (c *Client) enqueue(pod *corev1.Pod, deleted bool) {
	m, _ := ParsePod(pod) // a garbled pod still yields its name and what could be read
	ev := PodEvent{User: m.User, Server: m.Server, SpawnID: m.SpawnID, Pod: pod.Name, Held: m.Held && !deleted}
	if deleted {
		ev.Phase, ev.Message = Classify(nil, c.now(), c.cfg)
	} else {
		ev.Phase, ev.Message = Classify(pod, c.now(), c.cfg)
		if ev.Phase == PhaseRunning {
			ev.URL = m.URL
		}
	}
	c.queue.push(pod.Name+"/"+pod.Labels[v1.LabelSpawnID]+"/"+string(pod.UID), ev)
}

// reclassify queues every cached pod again so deadlines fire; unchanged
// readings are dropped by the dispatcher.
func (c *Client) reclassify() {
	c.mu.Lock()
	lister := c.lister
	c.mu.Unlock()
	pods, err := lister.Pods(c.cfg.Namespace).List(labels.Everything())
	if err != nil { // the cache lister cannot fail; keep the loop alive regardless
		c.log.Error("list cached pods", "err", err)
		return
	}
	for _, pod := range pods {
		if pod.Labels[v1.LabelManagedBy] == v1.ManagedByValue {
			c.enqueue(pod, false)
		}
	}
}

// tombstoneTTL is how long the dispatcher remembers a pod incarnation it
// reported gone, to drop a late event for it (a resync that read the cache
// just before the deletion). Measured with the client's clock.
const tombstoneTTL = 10 * time.Minute

// dispatch delivers queued events to subscribers until ctx is done. It drops
// an event equal to the last one delivered for the same pod incarnation, and
// any event for an incarnation already reported gone, so a late event never
// resurrects a pod.
func (c *Client) dispatch(ctx context.Context) {
	last := map[string]PodEvent{}
	gone := map[string]time.Time{}
	for {
		for {
			key, ev, ok := c.queue.pop()
			if !ok {
				break
			}
			if _, dead := gone[key]; dead {
				continue
			}
			if prev, seen := last[key]; seen && prev == ev {
				continue
			}
			if ev.Phase == PhaseGone {
				delete(last, key)
				gone[key] = c.now()
			} else {
				last[key] = ev
			}
			c.mu.Lock()
			subs := slices.Collect(maps.Values(c.subs))
			c.mu.Unlock()
			for _, fn := range subs {
				fn(ev)
			}
			if ctx.Err() != nil {
				return
			}
		}
		now := c.now()
		for key, at := range gone {
			if now.Sub(at) > tombstoneTTL {
				delete(gone, key)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-c.queue.wake:
		}
	}
}

// eventQueue is an unbounded, coalescing FIFO of pod events: pushing never
// blocks, and a key pushed again before it is popped keeps its place but
// takes the newer event, so the queue holds at most one event per pod.
type eventQueue struct {
	mu      sync.Mutex
	pending map[string]PodEvent
	order   []string
	wake    chan struct{} // capacity 1: "there may be work"
}

func newEventQueue() eventQueue {
	return eventQueue{pending: map[string]PodEvent{}, wake: make(chan struct{}, 1)}
}

func (q *eventQueue) push(key string, ev PodEvent) {
	q.mu.Lock()
	if _, ok := q.pending[key]; !ok {
		q.order = append(q.order, key)
	}
	q.pending[key] = ev
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *eventQueue) pop() (string, PodEvent, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.order) == 0 {
		return "", PodEvent{}, false
	}
	key := q.order[0]
	q.order = q.order[1:]
	ev := q.pending[key]
	delete(q.pending, key)
	return key, ev, true
}
