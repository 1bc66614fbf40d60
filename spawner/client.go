package spawner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

// FieldManager is the field manager of every write the spawner makes.
const FieldManager = "gpubroker"

// owned is the label every object the spawner writes carries
// (app.kubernetes.io/managed-by=gpubroker): the informer watches only such
// pods, and nothing without it is ever modified or deleted.
func owned() labels.Set { return labels.Set{v1.LabelManagedBy: v1.ManagedByValue} }

// maxConflictRetries bounds the get/compare/write loops of Create and Delete.
const maxConflictRetries = 3

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
	// retryFor bounds the retries of transient API errors (DefaultRetryFor).
	retryFor time.Duration
	// backoff spaces those retries (retryBackoff).
	backoff wait.Backoff

	syncedCh chan struct{} // closed once the cache has synced
	started  chan struct{} // closed by the first Run

	mu      sync.Mutex
	lister  corelisters.PodLister // nil until synced
	tokens  map[tokenKey]string   // notebook tokens of spawns
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
		retryFor: DefaultRetryFor,
		backoff:  retryBackoff,
		syncedCh: make(chan struct{}),
		started:  make(chan struct{}),
		subs:     map[int]func(PodEvent){},
		tokens:   map[tokenKey]string{},
		queue:    newEventQueue(),
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Create creates the Secret (when secretEnv is non-empty) and then the pod of
// one spawn: PutSecret then CreatePod, after checking both, so a bad spec
// writes nothing. s.SecretEnv is set from secretEnv. It is idempotent: a pod
// of the same spawn that already exists is success. Errors are PutSecret's
// and CreatePod's. After an error the Secret may exist without the pod;
// Delete(ctx, s.User, s.Server, s.SpawnID) removes it.
func (c *Client) Create(ctx context.Context, s Spec, secretEnv map[string]string) error {
	s.SecretEnv = len(secretEnv) > 0
	if err := checkSecretEnv(s, secretEnv); err != nil {
		return err
	}
	pod, err := Pod(c.cfg, s)
	if err != nil {
		return fmt.Errorf("create server %q/%q: %w", s.User, s.Server, err)
	}
	if s.SecretEnv {
		if err := c.PutSecret(ctx, s, secretEnv); err != nil {
			return err
		}
	}
	return c.createPod(ctx, s, pod)
}

// PutSecret writes the Secret of spawn (s.User, s.Server, s.SpawnID) that
// holds secretEnv, whose keys must be valid env names and not reserved (see
// Spec.Env); of s only those three fields are read, so it can run before
// the spawn's slice is placed. It is idempotent: a Secret of the same spawn
// (a retry of a create whose answer was lost) is left as it is, since the
// spawn's pod may already run with its values, its notebook token above
// all, which the proxy reads back; a gpubroker Secret of an earlier spawn
// is overwritten. Errors wrap ErrInvalid (a bad key), ErrNotOwned (a
// Secret of that name is not gpubroker's), ErrRejected (the API server
// refused it for good), ErrUnavailable (no answer, after retries of
// transient errors) or are the API error.
func (c *Client) PutSecret(ctx context.Context, s Spec, secretEnv map[string]string) error {
	if err := checkSecretEnv(s, secretEnv); err != nil {
		return err
	}
	secret := Secret(c.cfg, s, secretEnv)
	return c.retry(ctx, "create secret "+secret.Name, func(ctx context.Context) error { return c.putSecret(ctx, secret) })
}

// CreatePod creates the pod of one spawn; s.SecretEnv says that it reads
// the spawn's Secret, which PutSecret must have written first (a kubelet
// that finds it missing fails the container and retries only after its
// back-off). It is idempotent: a pod of the same spawn that already exists
// is success. Errors wrap ErrInvalid (bad spec), ErrPodExists (the name is
// held by a pod of another spawn, usually still terminating; retry later),
// ErrNotOwned (a pod of that name is not gpubroker's), ErrRejected (the API
// server refused it for good), ErrUnavailable, or are the API error.
func (c *Client) CreatePod(ctx context.Context, s Spec) error {
	pod, err := Pod(c.cfg, s)
	if err != nil {
		return fmt.Errorf("create server %q/%q: %w", s.User, s.Server, err)
	}
	return c.createPod(ctx, s, pod)
}

// checkSecretEnv refuses secret env names that are not valid or reserved;
// the error wraps ErrInvalid and names each.
func checkSecretEnv(s Spec, secretEnv map[string]string) error {
	var bad []error
	for _, k := range slices.Sorted(maps.Keys(secretEnv)) {
		if msgs := validation.IsEnvVarName(k); len(msgs) > 0 || reservedEnv(k) {
			bad = append(bad, fmt.Errorf("secret env %q is not a valid or allowed name", k))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("create server %q/%q: %w: %w", s.User, s.Server, ErrInvalid, errors.Join(bad...))
	}
	return nil
}

// createPod creates a valid pod, retrying transient errors.
func (c *Client) createPod(ctx context.Context, s Spec, pod *corev1.Pod) error {
	return c.retry(ctx, "create pod "+pod.Name, func(ctx context.Context) error { return c.createOnce(ctx, s, pod) })
}

// createOnce is one try of createPod.
func (c *Client) createOnce(ctx context.Context, s Spec, pod *corev1.Pod) error {
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
// left by an earlier spawn to hold it. A Secret of the same spawn (a retry
// of a create whose answer was lost) is left as it is: the spawn's pod may
// already run with its values, its notebook token above all, which the
// proxy reads back from the Secret.
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
		case old.Annotations[v1.AnnotationSpawnID] == secret.Annotations[v1.AnnotationSpawnID]:
			return nil
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

// apiError wraps a write error; validation (422) and admission's forbidden
// (403, e.g. ResourceQuota) answers also wrap ErrRejected. The authorizer's
// 403 does not: it is Transient.
func apiError(op, name string, err error) error {
	switch {
	case apierrors.IsInvalid(err) || (apierrors.IsForbidden(err) && !authzDenied(err)):
		return fmt.Errorf("%s %s: %w: %w", op, name, ErrRejected, err)
	case unavailable(err) || Transient(err):
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
	return c.retry(ctx, "delete server "+PodName(user, server), func(ctx context.Context) error { return c.deleteServer(ctx, user, server, spawnID) })
}

// deleteServer is one try of Delete.
func (c *Client) deleteServer(ctx context.Context, user, server, spawnID string) error {
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

// tokenCacheLimit bounds the cached notebook tokens; a full cache is
// cleared.
const tokenCacheLimit = 8192

// NotebookToken returns the notebook token of spawn spawnID of server
// (user, server), read from the server's Secret (v1.EnvNotebookToken) on
// first use and then kept (a spawn's token never changes). The error wraps
// ErrNoToken when the Secret is missing, not managed by gpubroker, of
// another spawn or without a token; other errors are the API server's
// (retryable).
func (c *Client) NotebookToken(ctx context.Context, user, server, spawnID string) (string, error) {
	return c.secretToken(ctx, user, server, spawnID, v1.EnvNotebookToken)
}

// HubServerToken returns the API token JupyterHub gave the notebook server
// of spawn spawnID ("JUPYTERHUB_API_TOKEN", which the broker keeps in the
// server's Secret), as NotebookToken returns the notebook token. It grants
// access to its own user's servers and activity only (JupyterHub's default
// "server" role: access:servers!user, users:activity!user), so the
// notebook, which holds it anyway, learns nothing from a request that
// carries it; the hub's own API token must never be sent to a notebook,
// whose process the tenant controls.
func (c *Client) HubServerToken(ctx context.Context, user, server, spawnID string) (string, error) {
	return c.secretToken(ctx, user, server, spawnID, EnvHubAPIToken)
}

// EnvHubAPIToken is the variable JupyterHub passes a spawned server its API
// token in.
const EnvHubAPIToken = "JUPYTERHUB_API_TOKEN"

// secretToken is NotebookToken of the Secret's key field.
func (c *Client) secretToken(ctx context.Context, user, server, spawnID, field string) (string, error) {
	key := tokenKey{user, server, spawnID, field}
	c.mu.Lock()
	tok, ok := c.tokens[key]
	c.mu.Unlock()
	if ok {
		return tok, nil
	}
	err := c.retry(ctx, "read secret "+SecretName(user, server), func(ctx context.Context) error {
		var err error
		tok, err = c.readToken(ctx, user, server, spawnID, field)
		return err
	})
	if err != nil {
		return "", err
	}
	c.mu.Lock()
	if len(c.tokens) >= tokenCacheLimit {
		clear(c.tokens)
	}
	c.tokens[key] = tok
	c.mu.Unlock()
	return tok, nil
}

// tokenKey names one token field of one spawn of one server.
type tokenKey struct{ user, server, spawnID, field string }

func (c *Client) readToken(ctx context.Context, user, server, spawnID, field string) (string, error) {
	name := SecretName(user, server)
	s, err := c.cs.CoreV1().Secrets(c.cfg.Namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return "", fmt.Errorf("secret %s: %w: it does not exist", name, ErrNoToken)
	case err != nil:
		return "", fmt.Errorf("secret %s: %w", name, err)
	case s.Labels[v1.LabelManagedBy] != v1.ManagedByValue:
		return "", fmt.Errorf("secret %s: %w: %w", name, ErrNoToken, ErrNotOwned)
	case spawnOf(s) != spawnID:
		return "", fmt.Errorf("secret %s: %w: it belongs to spawn %s", name, ErrNoToken, spawnOf(s))
	}
	tok := string(s.Data[field])
	if tok == "" {
		return "", fmt.Errorf("secret %s: %w: it has no %s", name, ErrNoToken, field)
	}
	return tok, nil
}

// DeletePod deletes one notebook pod by name with the same checks as Delete,
// leaving Secrets alone: for pods whose annotations are unreadable
// (ManagedPod.Err), whose server cannot be named. spawnID "" skips the spawn
// check.
func (c *Client) DeletePod(ctx context.Context, name, spawnID string) error {
	podAPI := c.cs.CoreV1().Pods(c.cfg.Namespace)
	return c.retry(ctx, "delete pod "+name, func(ctx context.Context) error {
		return c.deleteOwned(ctx, "pod", name, spawnID,
			func(ctx context.Context, name string) (metav1.Object, error) {
				return podAPI.Get(ctx, name, metav1.GetOptions{})
			},
			podAPI.Delete)
	})
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

// ManagedSecret is a Secret labelled managed-by=gpubroker, as Secrets lists
// it.
type ManagedSecret struct {
	Name string
	// User, Server and SpawnID are its annotations ("" when missing).
	User, Server, SpawnID string
	// UID and ResourceVersion identify the version listed (a respawn
	// rewrites the Secret in place, changing its resourceVersion);
	// DeleteSecret deletes only that version.
	UID, ResourceVersion string
}

// Secrets lists the namespace's Secrets labelled managed-by=gpubroker,
// from the API server's watch cache (resourceVersion "0": recent, not
// necessarily the newest), sorted by name. Transient errors are retried
// (see Transient).
func (c *Client) Secrets(ctx context.Context) ([]ManagedSecret, error) {
	var list *corev1.SecretList
	err := c.retry(ctx, "list secrets", func(ctx context.Context) error {
		var err error
		list, err = c.cs.CoreV1().Secrets(c.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: owned().String(), ResourceVersion: "0"})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list secrets: %w", err)
	}
	out := make([]ManagedSecret, 0, len(list.Items))
	for _, s := range list.Items {
		if s.Labels[v1.LabelManagedBy] != v1.ManagedByValue {
			continue // a label selector the server ignored must not widen what we touch
		}
		out = append(out, ManagedSecret{Name: s.Name, User: s.Annotations[v1.AnnotationUser], Server: s.Annotations[v1.AnnotationServer],
			SpawnID: spawnOf(&s), UID: string(s.UID), ResourceVersion: s.ResourceVersion})
	}
	slices.SortFunc(out, func(a, b ManagedSecret) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// DeleteSecret deletes the Secret s lists, on the condition that it is
// still that version (UID and resourceVersion preconditions): a Secret that
// a respawn rewrote or replaced since is left alone, as is one already
// gone; both are success.
func (c *Client) DeleteSecret(ctx context.Context, s ManagedSecret) error {
	uid, rv := types.UID(s.UID), s.ResourceVersion
	return c.retry(ctx, "delete secret "+s.Name, func(ctx context.Context) error {
		err := c.cs.CoreV1().Secrets(c.cfg.Namespace).Delete(ctx, s.Name, metav1.DeleteOptions{
			Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
		switch {
		case err == nil:
			c.log.InfoContext(ctx, "deleted", "kind", "secret", "name", s.Name, "slice_id", s.SpawnID)
			return nil
		case apierrors.IsNotFound(err), apierrors.IsConflict(err):
			return nil
		default:
			return fmt.Errorf("delete secret %s: %w", s.Name, err)
		}
	})
}
