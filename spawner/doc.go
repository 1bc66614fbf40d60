// Package spawner turns a server's spawn into a Kubernetes notebook pod and
// follows that pod's life. It is a library of the broker and depends only on
// client-go and broker/api/v1, never on broker/internal.
//
// # Parts
//
//   - Slug, SlugN, PodName, SecretName: the one naming function for every
//     Kubernetes name and label value (ARCHITECTURE.md "Names").
//   - Pod, Secret: pure functions from (Config, Spec) to objects, tested
//     against golden files in testdata/*.golden (regenerate with
//     `go test ./spawner/ -update` and review the diff like code).
//   - ParsePod: the inverse of Pod for identity and slice, so pods are the
//     durable record of allocations (invariant 2).
//   - Classify, URL: the pure reading of a pod's status into a Phase and a
//     sentence for the user, failing fast on terminal conditions.
//   - BaseURL: the path a server's notebook is served under through the
//     broker's proxy, /user/<user slug>/<server slug>/ (the pod's
//     GPUBROKER_BASE_URL).
//   - Client: create and delete, checking ownership, and a spawn's notebook
//     token from its Secret, kept per spawn (client.go); watch: the informer
//     cache behind Pods, the notebook's path prefix and a pod by the slugs of
//     its base URL, and PodEvents delivered to subscribers in order per pod
//     (watch.go).
//   - devcluster: a simulated cluster for dev mode.
//   - runner: a kubelet for machines without one, running each pod of its
//     nodes as a local process (e2e tests and dev mode's real notebooks).
//
// # Invariants
//
//   - Names: slugs are valid DNS-1123 labels of ≤ 63 characters, stable for
//     a raw name, and distinct for distinct raw names; an unchanged raw name
//     maps to itself; raw names go into annotations. Slugs never contain
//     "--", which PodName uses as its user/server separator.
//   - Ownership: every pod and Secret carries app.kubernetes.io/managed-by=
//     gpubroker, user and server slugs and the spawn id. Nothing without the
//     managed-by label is ever modified or deleted (ErrNotOwned). Delete
//     checks the spawn id (a caller's old spawn never deletes a newer one)
//     and passes the checked UID as a precondition.
//   - Idempotence: Create (PutSecret then CreatePod) of the same spawn is
//     success; Create over another spawn's pod is ErrPodExists; Delete of a
//     missing object is success. PutSecret needs only the spawn's identity,
//     so a caller may write it while the slice is still being placed; the
//     pod must come after it (a kubelet that finds its Secret missing fails
//     the container and retries only after its back-off).
//   - Finalizer: every pod is created with v1.FinalizerServerRecord, so
//     after its final delete (grace 0) it stays, Ended and read as
//     PhaseGone (HasPod no longer finds it), until ReleasePod removes the
//     finalizer; ReleasePod tests the pod's UID and the finalizer's index in
//     one JSON patch, so it never releases a newer pod of the name, and is
//     idempotent (finalizer.go).
//   - Every write uses FieldManager. Cached objects are never modified.
//   - Never answer from an unsynced cache: Pods returns ErrNotSynced until
//     the informer has synced.
//   - Events never block the informer: handlers classify and push onto an
//     unbounded coalescing queue (one entry per pod incarnation) drained by
//     one dispatcher goroutine owned by Run. Events are keyed by pod name,
//     spawn id and UID; once an incarnation is reported gone, later events
//     for it are dropped, so a late event never resurrects a pod.
//   - Time: deadlines (StartTimeout, ErrorGrace) are measured with the
//     Client's injected clock against the pod's creation and condition
//     times; Run re-classifies every cached pod each resync period
//     (WithResync, the broker's --pod-resync) so they fire without pod
//     updates; it reads the cache, and the informer never relists on a
//     timer. Missing timestamps never trigger a deadline.
//   - Secrets: credentials go into the server's Secret (envFrom), never into
//     plain pod env, the spawn's notebook token (JUPYTER_TOKEN) included; the
//     quota directory and the hook are mounted read-only and the container
//     drops all capabilities (invariant 3).
//   - A failing notebook reports its last output lines as the reason
//     (terminationMessagePolicy FallbackToLogsOnError).
//   - Goroutines: none start in constructors; Run owns all of them and
//     returns only after they exited.
//
// Run is single-replica safe for reads and events; writes are idempotent and
// guarded by ownership checks, so several broker replicas may call Create and
// Delete concurrently.
package spawner
