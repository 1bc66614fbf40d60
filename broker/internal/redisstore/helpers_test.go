package redisstore

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/redistest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fakeClock is an injected clock that moves only when told.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Date(2026, 11, 29, 14, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// newStore returns a store on srv under a prefix of its own, marked
// reconciled, with a fake clock.
func newStore(t *testing.T, srv *redistest.Server) (*Store, *fakeClock) {
	t.Helper()
	clk := newFakeClock()
	s := New(srv.Client(t), srv.Prefix(t), WithClock(clk.Now))
	if err := s.MarkReconciled(t.Context()); err != nil {
		t.Fatalf("MarkReconciled: %v", err)
	}
	return s, clk
}

// h200 returns a healthy H200 (143771 MiB, 132 SMs) on node.
func h200(uuid, node string) fleet.GPU {
	return fleet.GPU{UUID: uuid, Node: node, Model: "NVIDIA H200", MemoryMiB: 143771, SMCount: 132, Healthy: true, Mode: fleet.SharingSliced}
}

func register(t *testing.T, s *Store, gpus ...fleet.GPU) {
	t.Helper()
	for _, g := range gpus {
		if err := s.RegisterGPU(t.Context(), g); err != nil {
			t.Fatalf("RegisterGPU(%s): %v", g.UUID, err)
		}
	}
}

// slice returns a slice of mem MiB with cp% guaranteed and cp% limit.
func slice(mem int64, cp int) fleet.Slice {
	return fleet.Slice{MemoryMiB: mem, ComputePercent: cp, ComputeLimitPercent: cp}
}

func mustPlace(t *testing.T, s *Store, req fleet.PlaceRequest) fleet.Allocation {
	t.Helper()
	a, err := s.Place(t.Context(), req)
	if err != nil {
		t.Fatalf("Place(%s): %v", req.SliceID, err)
	}
	return a
}

// verify fails t if any placement invariant is violated.
func verify(t *testing.T, s *Store) {
	t.Helper()
	if err := s.Verify(t.Context()); err != nil {
		t.Fatalf("invariants violated:\n%v", err)
	}
}

var sliceSeq int

func nextSlice() string {
	sliceSeq++
	return fmt.Sprintf("s%04d", sliceSeq)
}

func redisZ(score float64, member string) redis.Z { return redis.Z{Score: score, Member: member} }
