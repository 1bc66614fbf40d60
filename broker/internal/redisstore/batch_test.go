package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/redistest"
)

// heldBatcher is a batcher whose run records each batch and, for the first
// one, waits until the test lets it go, so that calls made meanwhile queue.
type heldBatcher struct {
	*batcher[int, int]
	release chan struct{}
	mu      sync.Mutex
	batches [][]int
}

func newHeldBatcher(max int) *heldBatcher {
	h := &heldBatcher{release: make(chan struct{})}
	h.batcher = &batcher[int, int]{max: max, run: func(_ context.Context, reqs []int) ([]int, error) {
		h.mu.Lock()
		first := len(h.batches) == 0
		h.batches = append(h.batches, slices.Clone(reqs))
		h.mu.Unlock()
		if first {
			<-h.release
		}
		out := make([]int, len(reqs))
		for i, r := range reqs {
			out[i] = 10 * r
		}
		return out, nil
	}}
	return h
}

// waitQueued waits until n calls wait for a batch.
func (h *heldBatcher) waitQueued(t *testing.T, n int) {
	t.Helper()
	eventually(t, fmt.Sprintf("%d calls queued", n), func() (bool, string) {
		h.batcher.mu.Lock()
		defer h.batcher.mu.Unlock()
		return len(h.batcher.queue) == n, fmt.Sprintf("%d queued", len(h.batcher.queue))
	})
}

// firstSent waits until the first batch went out.
func (h *heldBatcher) firstSent(t *testing.T) {
	t.Helper()
	eventually(t, "the first call sent", func() (bool, string) {
		h.mu.Lock()
		defer h.mu.Unlock()
		return len(h.batches) > 0, "no batch yet"
	})
}

// eventually polls cond until it holds and fails t if it has not within
// 10 s.
func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10 s; last: %s", what, why)
		}
		<-time.After(time.Millisecond)
	}
}

func TestBatcherSendsALoneCallAtOnceAndGroupsWhatArrivesMeanwhile(t *testing.T) {
	h := newHeldBatcher(4)
	ctx := t.Context()
	results := make([]int, 10)
	errs := make([]error, 10)
	var wg sync.WaitGroup
	call := func(i int) {
		defer wg.Done()
		results[i], errs[i] = h.do(ctx, i)
	}
	wg.Add(1)
	go call(0)
	h.firstSent(t) // alone, while nothing else was in flight
	for i := 1; i < 10; i++ {
		wg.Add(1)
		go call(i)
		h.waitQueued(t, i) // one at a time, so the queue's order is known
	}
	close(h.release)
	wg.Wait()
	for i := range 10 {
		if errs[i] != nil || results[i] != 10*i {
			t.Errorf("call %d = %d, %v; want %d, nil", i, results[i], errs[i], 10*i)
		}
	}
	want := [][]int{{0}, {1, 2, 3, 4}, {5, 6, 7, 8}, {9}}
	if !slices.EqualFunc(h.batches, want, slices.Equal) {
		t.Errorf("batches = %v, want %v (at most max each, in arrival order)", h.batches, want)
	}
}

func TestBatcherDropsACallWhoseContextEndsWhileQueued(t *testing.T) {
	h := newHeldBatcher(8)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _, _ = h.do(t.Context(), 1) }()
	h.firstSent(t)
	cctx, cancel := context.WithCancel(t.Context())
	var cerr error
	go func() { defer wg.Done(); _, cerr = h.do(cctx, 2) }()
	h.waitQueued(t, 1)
	cancel()
	h.waitQueued(t, 0)
	var res int
	var err error
	wg.Add(1)
	go func() { defer wg.Done(); res, err = h.do(t.Context(), 3) }()
	h.waitQueued(t, 1)
	close(h.release)
	wg.Wait()
	if !errors.Is(cerr, context.Canceled) {
		t.Errorf("cancelled call: err = %v, want context.Canceled", cerr)
	}
	if err != nil || res != 30 {
		t.Errorf("call 3 = %d, %v", res, err)
	}
	if want := [][]int{{1}, {3}}; !slices.EqualFunc(h.batches, want, slices.Equal) {
		t.Errorf("batches = %v, want %v: the cancelled call must not be sent", h.batches, want)
	}
}

func TestBatcherGivesABatchErrorToEveryCallInIt(t *testing.T) {
	boom := errors.New("boom")
	b := &batcher[int, int]{max: 4, run: func(_ context.Context, reqs []int) ([]int, error) {
		if len(reqs) == 1 && reqs[0] == 2 {
			return []int{1, 2}, nil // one result too many
		}
		return nil, boom
	}}
	if _, err := b.do(t.Context(), 1); !errors.Is(err, boom) {
		t.Errorf("err = %v, want boom", err)
	}
	if _, err := b.do(t.Context(), 2); err == nil || !strings.Contains(err.Error(), "a batch of 1 got 2 results") {
		t.Errorf("err = %v, want a count mismatch", err)
	}
}

// TestPlaceBatchEachOperationStandsAlone runs one place batch holding a
// new slice, the same slice again, a quota refusal, a capacity refusal and
// a request whose user's usage field is corrupt (the body raises an
// error): each gets its own answer and only the error one fails.
func TestPlaceBatchEachOperationStandsAlone(t *testing.T) {
	srv := redistest.Start(t)
	s, _ := newStore(t, srv)
	register(t, s, h200("GPU-1", "n1"))
	ctx := t.Context()
	if err := s.rdb.HSet(ctx, s.k.Usage(), userUsage("mallory"), "not counters").Err(); err != nil {
		t.Fatal(err)
	}
	reqs := []fleet.PlaceRequest{
		{SliceID: "a", User: "alice", Slice: slice(8192, 20)},
		{SliceID: "a", User: "alice", Slice: slice(8192, 20)},
		{SliceID: "q", User: "alice", Slice: slice(8192, 20), UserQuota: fleet.Quota{Servers: 1}},
		{SliceID: "c", User: "bob", Slice: slice(200000, 20)},
		{SliceID: "m", User: "mallory", Slice: slice(8192, 20)},
		{SliceID: "b", User: "bob", Slice: slice(8192, 20)},
	}
	replies := runPlaceBatch(t, s, reqs)
	if len(replies) != len(reqs) {
		t.Fatalf("%d replies for %d ops", len(replies), len(reqs))
	}
	outcome := func(i int) string {
		r := replies[i]
		if r.err != nil {
			return "error: " + r.err.Error()
		}
		a, refusal, err := placeResult(reqs[i], r.reply)
		switch {
		case err != nil:
			return "bad reply: " + err.Error()
		case errors.Is(refusal, fleet.ErrQuotaExceeded):
			return "quota"
		case errors.Is(refusal, fleet.ErrNoCapacity):
			return "capacity"
		case refusal != nil:
			return "refusal: " + refusal.Error()
		}
		return fmt.Sprintf("%s on %s", a.SliceID, a.GPUUUID)
	}
	want := []string{"a on GPU-1", "a on GPU-1", "quota", "capacity", "error", "b on GPU-1"}
	for i := range reqs {
		got := outcome(i)
		if !strings.HasPrefix(got, want[i]) {
			t.Errorf("op %d (%s) = %q, want %q", i, reqs[i].SliceID, got, want[i])
		}
	}
	if r := replies[4]; r.err == nil || !strings.Contains(r.err.Error(), "usage field") {
		t.Errorf("corrupt usage: err = %v, want the script's usage field error", r.err)
	}
	// The corrupt field is as it was and nothing of mallory's was placed.
	if _, err := s.Allocation(ctx, "m"); !errors.Is(err, fleet.ErrNotFound) {
		t.Errorf("mallory's slice: err = %v, want not found", err)
	}
	if err := s.rdb.HDel(ctx, s.k.Usage(), userUsage("mallory")).Err(); err != nil {
		t.Fatal(err)
	}
	verify(t, s)
	for _, id := range []string{"a", "b"} {
		if ok, err := s.Release(ctx, id); err != nil || !ok {
			t.Errorf("Release(%s) = %v, %v", id, ok, err)
		}
	}
	verify(t, s)
}

func TestBatcherSendsAtOnceWhileFewerThanInFlightAreOut(t *testing.T) {
	h := newHeldBatcher(4)
	h.inFlight = 2
	done := make(chan struct{})
	go func() { defer close(done); _, _ = h.do(t.Context(), 1) }()
	h.firstSent(t)
	// The first batch is held; a second may go out beside it.
	if res, err := h.do(t.Context(), 2); err != nil || res != 20 {
		t.Errorf("second call = %d, %v; want 20 while the first is in flight", res, err)
	}
	close(h.release)
	<-done
}

// TestBatchRequestsOfDifferentLengths runs place and release batches whose
// requests carry different numbers of arguments (batch.lua reuses one
// ARGV table and clears what a longer request left): each request charges
// and un-charges only its own user and groups (verify checks the usage
// counters against the allocations).
func TestBatchRequestsOfDifferentLengths(t *testing.T) {
	srv := redistest.Start(t)
	s, _ := newStore(t, srv)
	register(t, s, h200("GPU-1", "n1"), h200("GPU-2", "n1"))
	ctx := t.Context()
	reqs := []fleet.PlaceRequest{
		{SliceID: "a", User: "alice", Slice: slice(8192, 20), GroupQuotas: map[string]fleet.Quota{"g1": {}, "g2": {Servers: 5}}},
		{SliceID: "b", User: "bob", Slice: slice(4096, 10)},
		{SliceID: "c", User: "carol", Slice: slice(4096, 10), GroupQuotas: map[string]fleet.Quota{"g3": {}}},
		{SliceID: "d", User: "dave", Slice: slice(4096, 10), UserQuota: fleet.Quota{MemoryMiB: 1000}},
	}
	replies := runPlaceBatch(t, s, reqs)
	for i, r := range replies {
		a, refusal, err := placeResult(reqs[i], r.reply)
		if err := errors.Join(r.err, err); err != nil {
			t.Fatalf("op %d: %v", i, err)
		}
		if i == 3 {
			if !errors.Is(refusal, fleet.ErrQuotaExceeded) {
				t.Errorf("dave: refusal %v, want his memory quota", refusal)
			}
			continue
		}
		if refusal != nil || !slices.Equal(a.Groups, fleet.SortedGroups(reqs[i].GroupQuotas)) {
			t.Errorf("op %d: %+v, %v; want placed with groups %v", i, a, refusal, fleet.SortedGroups(reqs[i].GroupQuotas))
		}
	}
	verify(t, s)
	rops := []scriptOp{s.releaseOp("a"), s.releaseOp("b"), s.releaseOp("c"), s.releaseOp("d")}
	rreplies, err := s.runReleases(ctx, rops)
	if err != nil {
		t.Fatalf("runReleases: %v", err)
	}
	for i, want := range []int64{1, 1, 1, 0} {
		if n, err := asInt(rreplies[i].reply); err != nil || n != want {
			t.Errorf("release %d = %v, %v; want %d", i, rreplies[i].reply, err, want)
		}
	}
	verify(t, s)
	if n, err := s.rdb.HLen(ctx, s.k.Usage()).Result(); err != nil || n != 0 {
		t.Errorf("usage fields after every release = %d, %v; want none", n, err)
	}
}

// runPlaceBatch runs reqs as one place batch (runPlaces) and returns its
// replies, one per request.
func runPlaceBatch(t *testing.T, s *Store, reqs []fleet.PlaceRequest) []batchReply {
	t.Helper()
	ops := make([]scriptOp, len(reqs))
	for i, r := range reqs {
		op, err := s.placeOp(r)
		if err != nil {
			t.Fatal(err)
		}
		ops[i] = op
	}
	replies, err := s.runPlaces(t.Context(), ops)
	if err != nil {
		t.Fatalf("runPlaces: %v", err)
	}
	return replies
}
