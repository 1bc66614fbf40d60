package fleet

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// PodCreateWindow bounds how long after its placement was recorded a spawn
// may still create its pod (servers.Service gives the pod create that
// deadline). It must exceed the spawner's retries of a busy API server
// (spawner.DefaultRetryFor).
const PodCreateWindow = 15 * time.Second

// RebuildFence is how long after Redis lost its data (its reconcile epoch
// began) a reconcile pass must wait before it may mark the allocations
// rebuilt: a spawn that placed on the lost data creates its pod within
// PodCreateWindow, so a pass after the fence sees every such pod; the rest
// covers the pod cache's lag and clocks that differ between replicas.
const RebuildFence = PodCreateWindow + 5*time.Second

// NewEpoch returns a reconcile epoch token begun at t: the Unix time in
// nanoseconds, "-", and nonce (random text without "-").
func NewEpoch(t time.Time, nonce string) string {
	return fmt.Sprintf("%d-%s", t.UnixNano(), nonce)
}

// EpochBegan returns when a token of NewEpoch began; ok is false for a token
// of another shape (an epoch written by an older broker), which callers
// treat as begun long ago.
func EpochBegan(token string) (t time.Time, ok bool) {
	ns, _, found := strings.Cut(token, "-")
	if !found {
		return time.Time{}, false
	}
	n, err := strconv.ParseInt(ns, 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.Unix(0, n), true
}
