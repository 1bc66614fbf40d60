// Package servers is the server lifecycle: it turns a create request into a
// placed slice and a notebook pod, follows the pod to running, and stops it.
//
// A create runs its refusable steps (profile check, quota and placement)
// inside the request, so a refusal is a 4xx with a readable message; the
// rest is driven by pod events from the spawner. Every step is a transition
// of the stored server record, checked by the store against the record's
// spawn id and fleet's transition table, so a late event from an old spawn
// never changes a newer one.
//
// Invariants:
//   - A slice is released only when its pod is gone or was never created;
//     a pod that is still terminating keeps its slice. A pod that has ended
//     but stays for gpubroker's finalizer (spawner.Ended) counts as gone,
//     and its finalizer is removed only once the server's end is recorded,
//     by the call that recorded it (ended.go), else by the reconciler
//     (which also rebuilds a record Redis lost first).
//   - A step that must happen once per transition (counting a spawn) is
//     taken only by the call whose Store.Advance (or Store.MoveFrom) moved
//     the state, so two calls handling the same pod event (a reconcile
//     pass's replay, a Lease handover) count it once, and release an ended
//     pod once.
//   - Steps after a successful placement run on a context detached from the
//     caller's (with its own deadline), so a client that hangs up does not
//     leave a half-created server; what a crash leaves half done is settled
//     by the reconciler (broker/internal/reconcile).
//   - Stopping never deletes user data: only the pod and its Secret go.
//   - The spawn's Secret is written side by side with placing and the
//     placement, and its pod created only once the Secret write succeeded;
//     a start that ends before its pod for good (refused, undone, stopped)
//     deletes the Secret again (in the background; the reconciler collects
//     it should that fail).
//   - Resize (enabled by WithResize) changes a running slice in place through
//     the store's one atomic script, then records it in the pod's
//     annotations and sends it to the node agent as the desired quota (then
//     the store's slice, should another resize have overtaken it), on a
//     context detached from the caller's once the store changed. A pod that
//     cannot record it undoes the store's change, unchecked (resize.go). It
//     never shrinks memory below a fresh agent sample of what the notebook
//     holds, and refuses when there is no fresh sample.
package servers
