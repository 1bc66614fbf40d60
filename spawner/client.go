package spawner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

// FieldManager is the field manager of every write the spawner makes.
const FieldManager = "gpubroker"

// DefaultResync is how often Run re-classifies every cached pod, so that
// deadline-based failures fire without a new pod update.
const DefaultResync = 5 * time.Second

// maxConflictRetries bounds the get/compare/write loops of Create and Delete.
const maxConflictRetries = 3

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
}

// Option configures a Client.
type Option func(*Client)

// WithClock sets the clock Classify's deadlines are measured with; default
// time.Now.
func WithClock(now func() time.Time) Option { return func(c *Client) { c.now = now } }

// WithResync sets how often Run re-classifies cached pods (> 0); default
// DefaultResync.
func WithResync(d time.Duration) Option {
	return func(c *Client) {
		if d > 0 {
			c.resync = d
		}
	}
}

// Client creates, watches and deletes notebook pods and their Secrets in one
// namespace. Reads come from an informer cache that Run keeps; before it has
// synced, reads fail with ErrNotSynced. Writes go to the API server. A Client
// is safe for concurrent use; Run must be called exactly once.
type Client struct {
	cs     kubernetes.Interface
	cfg    Config
	log    *slog.Logger
	now    func() time.Time
	resync time.Duration

	syncedCh chan struct{} // closed once the cache has synced
	started  chan struct{} // closed by the first Run

	mu      sync.Mutex
	lister  corelisters.PodLister // nil until synced
	subs    map[int]func(PodEvent)
	nextSub int

	queue eventQueue
}

// New returns a Client for cfg (defaults applied; Run reports an invalid
// config). A nil log discards. It starts nothing; call Run.
func New(cs kubernetes.Interface, cfg Config, log *slog.Logger, opts ...Option) *Client {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &Client{
		cs:       cs,
		cfg:      cfg.WithDefaults(),
		log:      log.With("namespace", cfg.Namespace),
		now:      time.Now,
		resync:   DefaultResync,
		syncedCh: make(chan struct{}),
		started:  make(chan struct{}),
		subs:     map[int]func(PodEvent){},
		queue:    newEventQueue(),
	}
	for _, o := range opts {
		o(c)
	}
	return c
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
			o.LabelSelector = labels.Set{v1.LabelManagedBy: v1.ManagedByValue}.String()
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
	objs, err := lister.Pods(c.cfg.Namespace).List(labels.SelectorFromSet(labels.Set{v1.LabelManagedBy: v1.ManagedByValue}))
	if err != nil {
		return nil, fmt.Errorf("list pods: %w", err)
	}
	now := c.now()
	out := make([]ManagedPod, 0, len(objs))
	for _, pod := range objs {
		m, err := ParsePod(pod)
		m.Err = err
		m.Phase, m.Message = Classify(pod, now, c.cfg)
		if m.Phase != PhaseRunning {
			m.URL = ""
		}
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Create creates the Secret (when secretEnv is non-empty) and then the pod of
// one spawn. s.SecretEnv is set from secretEnv, whose keys must be valid env
// names and not reserved (see Spec.Env). It is idempotent: a pod of the same
// spawn that already exists is success. Errors wrap ErrInvalid (bad spec),
// ErrPodExists (the name is held by a pod of another spawn, usually still
// terminating; retry later), ErrNotOwned (an object of that name is not
// gpubroker's), ErrRejected (the API server refused the objects for good),
// or the API error (retryable). After an error the Secret may exist without
// the pod; Delete(ctx, s.User, s.Server, s.SpawnID) removes it.
func (c *Client) Create(ctx context.Context, s Spec, secretEnv map[string]string) error {
	s.SecretEnv = len(secretEnv) > 0
	var bad []error
	for _, k := range slices.Sorted(maps.Keys(secretEnv)) {
		if msgs := validation.IsEnvVarName(k); len(msgs) > 0 || reservedEnv(k) {
			bad = append(bad, fmt.Errorf("secret env %q is not a valid or allowed name", k))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("create server %q/%q: %w: %w", s.User, s.Server, ErrInvalid, errors.Join(bad...))
	}
	pod, err := Pod(c.cfg, s)
	if err != nil {
		return fmt.Errorf("create server %q/%q: %w", s.User, s.Server, err)
	}
	if s.SecretEnv {
		if err := c.putSecret(ctx, Secret(c.cfg, s, secretEnv)); err != nil {
			return err
		}
	}
	for range maxConflictRetries {
		_, err := c.cs.CoreV1().Pods(c.cfg.Namespace).Create(ctx, pod, metav1.CreateOptions{FieldManager: FieldManager})
		if err == nil {
			c.log.InfoContext(ctx, "pod created", "pod", pod.Name, "slice_id", s.SpawnID, "gpu_uuid", s.GPU.UUID, "mem_mib", s.Slice.MemoryMiB, "sm_percent", s.Slice.ComputePercent)
			return nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return apiError("create pod", pod.Name, err)
		}
		old, err := c.cs.CoreV1().Pods(c.cfg.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			continue // deleted in between: try again
		case err != nil:
			return apiError("create pod: get existing", pod.Name, err)
		case old.Labels[v1.LabelManagedBy] != v1.ManagedByValue:
			return fmt.Errorf("create pod %s: a pod of that name exists: %w", pod.Name, ErrNotOwned)
		case old.Annotations[v1.AnnotationSpawnID] == s.SpawnID:
			return nil
		case old.DeletionTimestamp != nil:
			return fmt.Errorf("create pod %s: %w: the pod of an earlier start (spawn %s) is still shutting down",
				pod.Name, ErrPodExists, old.Annotations[v1.AnnotationSpawnID])
		default:
			return fmt.Errorf("create pod %s: %w: the pod of another start (spawn %s) still exists",
				pod.Name, ErrPodExists, old.Annotations[v1.AnnotationSpawnID])
		}
	}
	return fmt.Errorf("create pod %s: %w: the pod keeps reappearing", pod.Name, ErrPodExists)
}

// putSecret creates secret, or updates the gpubroker Secret of that name
// (an earlier spawn's, or this spawn's on a retry) to hold it.
func (c *Client) putSecret(ctx context.Context, secret *corev1.Secret) error {
	api := c.cs.CoreV1().Secrets(c.cfg.Namespace)
	for range maxConflictRetries {
		_, err := api.Create(ctx, secret, metav1.CreateOptions{FieldManager: FieldManager})
		if err == nil {
			return nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return apiError("create secret", secret.Name, err)
		}
		old, err := api.Get(ctx, secret.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return apiError("create secret: get existing", secret.Name, err)
		case old.Labels[v1.LabelManagedBy] != v1.ManagedByValue:
			return fmt.Errorf("create secret %s: a secret of that name exists: %w", secret.Name, ErrNotOwned)
		}
		next := old.DeepCopy()
		next.Labels, next.Annotations, next.Data, next.StringData = secret.Labels, secret.Annotations, secret.Data, nil
		_, err = api.Update(ctx, next, metav1.UpdateOptions{FieldManager: FieldManager})
		switch {
		case err == nil:
			return nil
		case apierrors.IsConflict(err) || apierrors.IsNotFound(err):
			continue
		default:
			return apiError("update secret", secret.Name, err)
		}
	}
	return fmt.Errorf("create secret %s: too many concurrent changes", secret.Name)
}

// apiError wraps a write error; validation (422) and forbidden (403, e.g.
// ResourceQuota or admission) answers also wrap ErrRejected.
func apiError(op, name string, err error) error {
	switch {
	case apierrors.IsInvalid(err) || apierrors.IsForbidden(err):
		return fmt.Errorf("%s %s: %w: %w", op, name, ErrRejected, err)
	case unavailable(err):
		return fmt.Errorf("%s %s: %w: %w", op, name, ErrUnavailable, err)
	}
	return fmt.Errorf("%s %s: %w", op, name, err)
}

// unavailable reports whether err means that the API server did not
// answer the request (so a write's outcome is unknown): no status from it
// at all (a connection or a timeout error), or a status that says "not
// now" (500, 503, 504, 429, a server timeout).
func unavailable(err error) bool {
	var st apierrors.APIStatus
	if !errors.As(err, &st) {
		return !errors.Is(err, context.Canceled)
	}
	return apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsTooManyRequests(err) ||
		apierrors.IsServiceUnavailable(err) || apierrors.IsInternalError(err) || apierrors.IsUnexpectedServerError(err)
}

// Delete deletes the pod and Secret of a server. It is idempotent: objects
// that are gone, already terminating, or (when spawnID is not "") belong to
// another spawn are left alone and count as success. It deletes only objects
// labelled managed-by=gpubroker (others give ErrNotOwned), and passes the UID
// it checked as a precondition, so a newer pod that took the name in between
// is never deleted.
func (c *Client) Delete(ctx context.Context, user, server, spawnID string) error {
	podAPI := c.cs.CoreV1().Pods(c.cfg.Namespace)
	secretAPI := c.cs.CoreV1().Secrets(c.cfg.Namespace)
	err := c.deleteOwned(ctx, "pod", PodName(user, server), spawnID,
		func(ctx context.Context, name string) (metav1.Object, error) {
			return podAPI.Get(ctx, name, metav1.GetOptions{})
		},
		podAPI.Delete)
	if err != nil {
		return err
	}
	return c.deleteOwned(ctx, "secret", SecretName(user, server), spawnID,
		func(ctx context.Context, name string) (metav1.Object, error) {
			return secretAPI.Get(ctx, name, metav1.GetOptions{})
		},
		secretAPI.Delete)
}

// DeletePod deletes one notebook pod by name with the same checks as Delete,
// leaving Secrets alone: for pods whose annotations are unreadable
// (ManagedPod.Err), whose server cannot be named. spawnID "" skips the spawn
// check.
func (c *Client) DeletePod(ctx context.Context, name, spawnID string) error {
	podAPI := c.cs.CoreV1().Pods(c.cfg.Namespace)
	return c.deleteOwned(ctx, "pod", name, spawnID,
		func(ctx context.Context, name string) (metav1.Object, error) {
			return podAPI.Get(ctx, name, metav1.GetOptions{})
		},
		podAPI.Delete)
}

func (c *Client) deleteOwned(ctx context.Context, kind, name, spawnID string,
	get func(context.Context, string) (metav1.Object, error),
	del func(context.Context, string, metav1.DeleteOptions) error,
) error {
	for range maxConflictRetries {
		obj, err := get(ctx, name)
		switch {
		case apierrors.IsNotFound(err):
			return nil
		case err != nil:
			return apiError("delete "+kind+": get", name, err)
		case obj.GetLabels()[v1.LabelManagedBy] != v1.ManagedByValue:
			return fmt.Errorf("delete %s %s: %w", kind, name, ErrNotOwned)
		case spawnID != "" && spawnOf(obj) != spawnID:
			c.log.DebugContext(ctx, "not deleting another spawn's object", "kind", kind, "name", name, "slice_id", spawnOf(obj))
			return nil
		case obj.GetDeletionTimestamp() != nil:
			return nil
		}
		opts := metav1.DeleteOptions{}
		if uid := obj.GetUID(); uid != "" {
			opts.Preconditions = &metav1.Preconditions{UID: &uid}
		}
		err = del(ctx, name, opts)
		switch {
		case err == nil:
			c.log.InfoContext(ctx, "deleted", "kind", kind, "name", name, "slice_id", spawnOf(obj))
			return nil
		case apierrors.IsNotFound(err):
			return nil
		case apierrors.IsConflict(err): // the UID changed: look again
			continue
		default:
			return apiError("delete "+kind, name, err)
		}
	}
	return fmt.Errorf("delete %s %s: too many concurrent changes", kind, name)
}

// spawnOf returns the spawn id an object records (annotation, else label).
func spawnOf(obj metav1.Object) string {
	if id, ok := obj.GetAnnotations()[v1.AnnotationSpawnID]; ok {
		return id
	}
	return obj.GetLabels()[v1.LabelSpawnID]
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
	ev := PodEvent{User: m.User, Server: m.Server, SpawnID: m.SpawnID, Pod: pod.Name}
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
