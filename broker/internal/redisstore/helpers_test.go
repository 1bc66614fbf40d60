package redisstore

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
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

// twoReplicas returns two stores on separate clients of one fresh Redis
// (two broker replicas), marked reconciled so that placement runs.
func twoReplicas(t *testing.T) []*Store {
	t.Helper()
	srv := redistest.Start(t)
	prefix := srv.Prefix(t)
	replicas := []*Store{New(srv.Client(t), prefix), New(srv.Client(t), prefix)}
	if err := replicas[0].MarkReconciled(t.Context()); err != nil {
		t.Fatal(err)
	}
	return replicas
}

// raceWorkers runs workers goroutines of rounds each, worker w on
// replicas[w%2] with its own random source (seeded w, seed): in a round a
// worker holding slices releases a random one a third of the time, else
// places next(w, r, rnd) and hands the result to outcome, which says
// whether the slice is now held or returns an error that ends the worker.
// At the end each worker releases what it holds. It returns every error.
func raceWorkers(t *testing.T, replicas []*Store, workers, rounds int, seed uint64,
	next func(w, r int, rnd *rand.Rand) fleet.PlaceRequest,
	outcome func(req fleet.PlaceRequest, a fleet.Allocation, err error) (bool, error)) []error {
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(uint64(w), seed))
			st := replicas[w%2]
			var held []string
			for r := range rounds {
				if len(held) > 0 && rnd.IntN(3) == 0 {
					i := rnd.IntN(len(held))
					if ok, err := st.Release(t.Context(), held[i]); err != nil || !ok {
						errs <- fmt.Errorf("release %s = %v, %v", held[i], ok, err)
						return
					}
					held = append(held[:i], held[i+1:]...)
					continue
				}
				req := next(w, r, rnd)
				a, err := st.Place(t.Context(), req)
				keep, err := outcome(req, a, err)
				if err != nil {
					errs <- err
					return
				}
				if keep {
					held = append(held, req.SliceID)
				}
			}
			for _, id := range held {
				if _, err := st.Release(t.Context(), id); err != nil {
					errs <- fmt.Errorf("release %s: %w", id, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	var out []error
	for err := range errs {
		out = append(out, err)
	}
	return out
}

// usageValue is a usage field's value (usageFormat) holding servers, mem
// MiB and cp percent, as lib.lua's usage_store writes it.
func usageValue(servers int32, mem int64, cp int32) string {
	b := binary.LittleEndian.AppendUint32(nil, uint32(servers))
	b = binary.LittleEndian.AppendUint64(b, uint64(mem))
	return string(binary.LittleEndian.AppendUint32(b, uint32(cp)))
}
