package agentstore_test

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/redistest"
	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).reaper"))
}

func newStore(t *testing.T, opts ...agentstore.Option) (*agentstore.Store, *redis.Client) {
	t.Helper()
	return newStoreTB(t, opts...)
}

func newStoreTB(tb testing.TB, opts ...agentstore.Option) (*agentstore.Store, *redis.Client) {
	tb.Helper()
	srv := redistest.Start(tb)
	c := srv.Client(tb)
	return agentstore.New(c, srv.Prefix(tb), opts...), c
}

func ptr[T any](v T) *T { return &v }

var t0 = time.Date(2026, 11, 29, 15, 0, 0, 0, time.UTC)

func TestSamplesRoundTripKeepMissingAsMissing(t *testing.T) {
	st, _ := newStore(t)
	tests := []struct {
		name string
		in   agentstore.Sample
	}{
		{name: "complete sample", in: agentstore.Sample{Slice: "s1", At: t0, Interval: time.Second,
			SMPercent: ptr(42), MemoryUsedMiB: ptr(int64(1024)), MemoryLimitMiB: 8192, Processes: ptr(2),
			LastKernel: ptr(t0.Add(-time.Second))}},
		{name: "measured zero stays zero", in: agentstore.Sample{Slice: "s2", At: t0, Interval: time.Second,
			SMPercent: ptr(0), MemoryUsedMiB: ptr(int64(0)), MemoryLimitMiB: 8192, Processes: ptr(0),
			LastKernel: ptr(time.Time{})}},
		{name: "missing stays missing", in: agentstore.Sample{Slice: "s3", At: t0, Interval: time.Second,
			MemoryLimitMiB: 8192, Missing: "gpu unhealthy: xid 79"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := st.AddSamples(t.Context(), []agentstore.Sample{tc.in}); err != nil {
				t.Fatal(err)
			}
			got, err := st.LatestSample(t.Context(), tc.in.Slice)
			if err != nil {
				t.Fatal(err)
			}
			got.ID = ""
			if diff := cmp.Diff(tc.in, got); diff != "" {
				t.Errorf("sample (-want +got):\n%s", diff)
			}
		})
	}
}

func TestLatestSampleOfUnknownSliceIsNotFound(t *testing.T) {
	st, _ := newStore(t)
	if _, err := st.LatestSample(t.Context(), "nope"); !errors.Is(err, agentstore.ErrNotFound) {
		t.Fatalf("err = %v, want ErrNotFound", err)
	}
}

func TestSampleStaleAfterThreeIntervals(t *testing.T) {
	s := agentstore.Sample{At: t0, Interval: time.Second}
	tests := []struct {
		name string
		now  time.Time
		want bool
	}{
		{name: "fresh at its own time", now: t0, want: false},
		{name: "fresh at three intervals", now: t0.Add(3 * time.Second), want: false},
		{name: "stale just after three intervals", now: t0.Add(3*time.Second + time.Millisecond), want: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := s.Stale(tc.now); got != tc.want {
				t.Errorf("Stale(%s) = %v, want %v", tc.now, got, tc.want)
			}
		})
	}
	if !(agentstore.Sample{At: t0}).Stale(t0) {
		t.Error("a sample without interval must be stale")
	}
}

// TestRecentSamplesBatch reads many slices in one call: each slice's
// newest samples down to the first one before since, none for a slice
// without samples, and a slice's history ends just before a sample that
// does not decode (older ones are not trusted); what it returns decodes as
// RecentSamples does.
func TestRecentSamplesBatch(t *testing.T) {
	st, c := newStore(t)
	kernel := t0.Add(-time.Second)
	var in []agentstore.Sample
	for i := range 4 {
		in = append(in, agentstore.Sample{Slice: "s1", At: t0.Add(time.Duration(i) * 10 * time.Second), Interval: 10 * time.Second,
			SMPercent: ptr(10 * i), MemoryUsedMiB: ptr(int64(1024)), Processes: ptr(1), LastKernel: &kernel})
	}
	in = append(in, agentstore.Sample{Slice: "s3", At: t0, Interval: time.Second, SMPercent: ptr(5), Missing: "gpu lost"})
	if err := st.AddSamples(t.Context(), in); err != nil {
		t.Fatal(err)
	}
	// A corrupt entry in s3's stream, then a good one after it.
	if err := c.XAdd(t.Context(), &redis.XAddArgs{Stream: st.Keys().Samples("s3"), Values: []any{"t", "soon"}}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := st.AddSamples(t.Context(), []agentstore.Sample{{Slice: "s3", At: t0.Add(time.Second), Interval: time.Second, SMPercent: ptr(7)}}); err != nil {
		t.Fatal(err)
	}
	got, err := st.RecentSamplesBatch(t.Context(), []string{"s1", "s2", "s3"}, 10, t0.Add(15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	s1, err := st.RecentSamples(t.Context(), "s1", 10)
	if err != nil {
		t.Fatal(err)
	}
	s3, err := st.LatestSample(t.Context(), "s3")
	if err != nil {
		t.Fatal(err)
	}
	want := [][]agentstore.Sample{s1[:3], nil, {s3}} // s1: 30 s, 20 s and 10 s (the first before 15 s)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("batch (-want +got):\n%s", diff)
	}
	if n := len(s1); n != 4 {
		t.Errorf("RecentSamples(s1) has %d samples, want 4", n)
	}
}

func TestSampleStreamIsBoundedAndExpires(t *testing.T) {
	st, c := newStore(t, agentstore.WithMaxLen(200), agentstore.WithSampleTTL(time.Hour))
	var batch []agentstore.Sample
	for i := range 2000 {
		batch = append(batch, agentstore.Sample{Slice: "s", At: t0.Add(time.Duration(i) * time.Second), Interval: time.Second, MemoryLimitMiB: 1})
		if len(batch) == 100 {
			if err := st.AddSamples(t.Context(), batch); err != nil {
				t.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	n, err := c.XLen(t.Context(), st.Keys().Samples("s")).Result()
	if err != nil {
		t.Fatal(err)
	}
	// MAXLEN ~ trims whole listpack nodes (100 entries by default).
	if n < 200 || n > 300 {
		t.Errorf("stream holds %d entries, want 200..300", n)
	}
	ttl, err := c.PTTL(t.Context(), st.Keys().Samples("s")).Result()
	if err != nil {
		t.Fatal(err)
	}
	if ttl <= 0 || ttl > time.Hour {
		t.Errorf("stream TTL %s, want in (0, 1h]", ttl)
	}
}

func TestHeartbeatInventoryAndStaleNodes(t *testing.T) {
	st, _ := newStore(t)
	gpu := func(uuid, node string, healthy bool, reason string) agentstore.GPUReport {
		return agentstore.GPUReport{GPU: v1.GPU{UUID: uuid, Node: node, Model: "NVIDIA H200", MemoryMiB: 143771, SMCount: 132, Healthy: healthy},
			Reason: reason, Since: t0}
	}
	a := agentstore.NodeReport{Node: "gpu-a", At: t0, HeartbeatMs: 10000, SampleMs: 1000,
		GPUs: []agentstore.GPUReport{gpu("GPU-1", "gpu-a", true, ""), gpu("GPU-2", "gpu-a", false, "xid 79")}}
	b := agentstore.NodeReport{Node: "gpu-b", At: t0.Add(-31 * time.Second), HeartbeatMs: 10000, SampleMs: 1000,
		GPUs: []agentstore.GPUReport{gpu("GPU-3", "gpu-b", true, "")}}
	for _, r := range []agentstore.NodeReport{a, b} {
		if err := st.Heartbeat(t.Context(), r); err != nil {
			t.Fatal(err)
		}
	}
	inv, err := st.Inventory(t.Context(), t0.Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	want := agentstore.Inventory{GPUs: a.GPUs, StaleNodes: []string{"gpu-b"}}
	if diff := cmp.Diff(want, inv); diff != "" {
		t.Errorf("inventory (-want +got):\n%s", diff)
	}
	// Three heartbeat intervals after its report, node a is stale too.
	inv, err = st.Inventory(t.Context(), t0.Add(30*time.Second+time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"gpu-a", "gpu-b"}, inv.StaleNodes); diff != "" || len(inv.GPUs) != 0 {
		t.Errorf("stale nodes (-want +got):\n%s; gpus %v", diff, inv.GPUs)
	}
}

func TestHeartbeatRefusesBadReport(t *testing.T) {
	st, _ := newStore(t)
	if err := st.Heartbeat(t.Context(), agentstore.NodeReport{Node: "n"}); err == nil {
		t.Fatal("heartbeat without interval accepted")
	}
}

func TestDesiredAndAppliedQuota(t *testing.T) {
	st, _ := newStore(t)
	ctx := t.Context()
	if _, err := st.DesiredQuota(ctx, "s"); !errors.Is(err, agentstore.ErrNotFound) {
		t.Fatalf("err = %v, want ErrNotFound", err)
	}
	q := v1.Slice{MemoryMiB: 4096, ComputePercent: 20, ComputeLimitPercent: 50}
	for want := int64(1); want <= 2; want++ {
		gen, err := st.SetDesiredQuota(ctx, "s", q)
		if err != nil {
			t.Fatal(err)
		}
		if gen != want {
			t.Fatalf("generation %d, want %d", gen, want)
		}
	}
	got, err := st.DesiredQuota(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(agentstore.DesiredQuota{Generation: 2, Slice: q}, got); diff != "" {
		t.Errorf("desired (-want +got):\n%s", diff)
	}
	if _, err := st.SetDesiredQuota(ctx, "s", v1.Slice{MemoryMiB: 1, ComputePercent: 50, ComputeLimitPercent: 40}); err == nil {
		t.Error("limit below guarantee accepted")
	}
	ap := agentstore.AppliedQuota{Generation: 2, FileGeneration: 7, Node: "gpu-a", At: t0}
	if err := st.SetAppliedQuota(ctx, "s", ap); err != nil {
		t.Fatal(err)
	}
	gotAp, err := st.AppliedQuota(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(ap, gotAp); diff != "" {
		t.Errorf("applied (-want +got):\n%s", diff)
	}
	if err := st.DeleteQuotas(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	if _, err := st.AppliedQuota(ctx, "s"); !errors.Is(err, agentstore.ErrNotFound) {
		t.Fatalf("after delete: err = %v, want ErrNotFound", err)
	}
}

func TestWatchQuotaChangesDeliversPublishedSlices(t *testing.T) {
	st, c := newStore(t)
	ctx, cancel := context.WithCancel(t.Context())
	got := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- st.WatchQuotaChanges(ctx, func(s string) {
			select {
			case got <- s:
			case <-ctx.Done():
			}
		})
	}()
	waitSubscribed(t, c, st.Keys().QuotaChanged())
	if _, err := st.SetDesiredQuota(t.Context(), "s9", v1.Slice{MemoryMiB: 1, ComputePercent: 1, ComputeLimitPercent: 1}); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-got:
		if s != "s9" {
			t.Errorf("got slice %q, want s9", s)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no notification within 10 s")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("WatchQuotaChanges returned %v after cancel, want nil", err)
	}
}

// waitSubscribed polls PUBSUB NUMSUB until channel has a subscriber.
func waitSubscribed(t *testing.T, c *redis.Client, channel string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		m, err := c.PubSubNumSub(t.Context(), channel).Result()
		if err != nil {
			t.Fatal(err)
		}
		if m[channel] > 0 {
			return
		}
		runtime.Gosched()
	}
	t.Fatalf("no subscriber on %s within 10 s", channel)
}

func TestAuditRoundTrip(t *testing.T) {
	st, _ := newStore(t)
	r := agentstore.AuditRecord{At: t0, Node: "gpu-a", Action: "kill", Reason: "over-memory", Policy: "kill tolerance=5% samples=3",
		Slice: "s", Pod: "p", Namespace: "ns", PID: 42, GPU: "GPU-1", MemoryUsedMiB: 9000, MemoryLimitMiB: 8192, Samples: 3}
	if err := st.AddAudit(t.Context(), r); err != nil {
		t.Fatal(err)
	}
	got, err := st.RecentAudit(t.Context(), 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) == 1 {
		r.ID = got[0].ID // set by the read
	}
	if diff := cmp.Diff([]agentstore.AuditRecord{r}, got); diff != "" || r.ID == "" {
		t.Errorf("audit (-want +got):\n%s (id %q)", diff, r.ID)
	}
}

// TestAuditBeforePagesAndSkipsCorruptRecords: pages of the newest records
// with ids, older ones from the cursor on, a corrupt record skipped.
func TestAuditBeforePagesAndSkipsCorruptRecords(t *testing.T) {
	st, c := newStore(t)
	for i := range 3 {
		if err := st.AddAudit(t.Context(), agentstore.AuditRecord{At: t0.Add(time.Duration(i) * time.Second), Node: "n1", Action: "report", PID: uint32(i + 1)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.XAdd(t.Context(), &redis.XAddArgs{Stream: st.Keys().AgentAudit(), Values: []any{"r", "{not json"}}).Err(); err != nil {
		t.Fatal(err)
	}
	pids := func(rs []agentstore.AuditRecord) []uint32 {
		var out []uint32
		for _, r := range rs {
			out = append(out, r.PID)
		}
		return out
	}
	page1, next, err := st.AuditBefore(t.Context(), "", 2)
	if err != nil || next == "" {
		t.Fatalf("page 1: %v next %q", err, next)
	}
	page2, next2, err := st.AuditBefore(t.Context(), next, 2)
	if err != nil {
		t.Fatal(err)
	}
	page3, next3, err := st.AuditBefore(t.Context(), next2, 2)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([][]uint32{{3}, {2, 1}, nil}, [][]uint32{pids(page1), pids(page2), pids(page3)}); diff != "" || next3 != "" {
		t.Errorf("pages (-want +got):\n%s next %q", diff, next3)
	}
	for _, r := range append(page1, page2...) {
		if r.ID == "" {
			t.Errorf("record %d has no id", r.PID)
		}
	}
}

// day24h writes 24 h of 1 Hz samples for one slice through AddSamples, in
// batches as an agent with many slices would, and returns the stream's
// memory (MEMORY USAGE ... SAMPLES 0, exact) and length.
func day24h(tb testing.TB, st *agentstore.Store, c *redis.Client) (bytes, entries int64) {
	tb.Helper()
	const day = 24 * 3600
	batch := make([]agentstore.Sample, 0, 1000)
	kernel := t0
	for i := range day {
		at := t0.Add(time.Duration(i) * time.Second)
		if i%7 == 0 {
			kernel = at
		}
		batch = append(batch, agentstore.Sample{Slice: "spawn-0123456789abcdef", At: at, Interval: time.Second,
			SMPercent: ptr(i % 101), MemoryUsedMiB: ptr(int64(40000 + i%30000)), MemoryLimitMiB: 81920,
			Processes: ptr(1 + i%4), LastKernel: ptr(kernel)})
		if len(batch) == cap(batch) || i == day-1 {
			if err := st.AddSamples(tb.Context(), batch); err != nil {
				tb.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	key := st.Keys().Samples("spawn-0123456789abcdef")
	bytes, err := c.MemoryUsage(tb.Context(), key, 0).Result()
	if err != nil {
		tb.Fatal(err)
	}
	entries, err = c.XLen(tb.Context(), key).Result()
	if err != nil {
		tb.Fatal(err)
	}
	return bytes, entries
}

// sampleBytesBound is the documented bound on one slice's sample stream
// with the default MaxLen (3600): at most 3700 entries of at most ~70
// bytes, plus the stream's node overhead.
const sampleBytesBound = 384 << 10

func TestSampleStreamAfter24hStaysUnderTheBound(t *testing.T) {
	st, c := newStore(t)
	bytes, n := day24h(t, st, c)
	if n > agentstore.DefaultMaxLen+100 {
		t.Errorf("%d entries after 24 h, want at most MaxLen+100 = %d", n, agentstore.DefaultMaxLen+100)
	}
	if bytes > sampleBytesBound {
		t.Errorf("%d bytes per slice after 24 h, want at most %d", bytes, sampleBytesBound)
	}
	t.Logf("24 h of 1 Hz samples: %d entries, %d bytes", n, bytes)
}

// BenchmarkRedisBytesPerSlice24h prints the Redis memory of one slice's
// samples after the equivalent of 24 h at 1 Hz (86,400 samples).
func BenchmarkRedisBytesPerSlice24h(b *testing.B) {
	var bytes, n int64
	for b.Loop() {
		st, c := newStoreTB(b)
		bytes, n = day24h(b, st, c)
	}
	b.ReportMetric(float64(bytes), "bytes/slice")
	b.ReportMetric(float64(n), "entries/slice")
	b.Logf("after 24 h of 1 Hz samples: %d bytes and %d entries per slice (bound %d bytes, MaxLen ~%d)",
		bytes, n, sampleBytesBound, agentstore.DefaultMaxLen)
}

// TestFollowAuditDeliversEachRecordOnceAcrossConsumers runs two followers
// in one group, as two broker replicas do: every record written after the
// group exists reaches exactly one of them, none written before does, a
// record whose handler failed comes back, and a follower started later in
// the same group gets what was written while none ran.
func TestFollowAuditDeliversEachRecordOnceAcrossConsumers(t *testing.T) {
	st, rdb := newStore(t, agentstore.WithAuditRetry(200*time.Millisecond))
	ctx := t.Context()
	rec := func(pid uint32) agentstore.AuditRecord {
		return agentstore.AuditRecord{At: t0, Node: "gpu-a", Action: "kill", Reason: "over-memory", PID: pid, Slice: "s", User: "alice", Server: "lab"}
	}
	if err := st.AddAudit(ctx, rec(1)); err != nil { // before the group: never delivered
		t.Fatal(err)
	}
	var mu sync.Mutex
	got := map[uint32][]string{}
	failedOnce := false
	follow := func(ctx context.Context, name string) <-chan error {
		done := make(chan error, 1)
		go func() {
			done <- st.FollowAudit(ctx, "broker-events", name, func(_ context.Context, r agentstore.AuditRecord) error {
				mu.Lock()
				defer mu.Unlock()
				if r.PID == 7 && !failedOnce {
					failedOnce = true
					return errors.New("server store down")
				}
				got[r.PID] = append(got[r.PID], name)
				return nil
			})
		}()
		return done
	}
	waitGroup := func() {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			groups, err := rdb.XInfoGroups(ctx, st.Keys().AgentAudit()).Result()
			if err == nil && len(groups) == 1 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("no consumer group within 10 s: %v %v", groups, err)
			}
			<-time.After(2 * time.Millisecond)
		}
	}
	delivered := func(pids ...uint32) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			mu.Lock()
			n := 0
			for _, p := range pids {
				if len(got[p]) > 0 {
					n++
				}
			}
			mu.Unlock()
			if n == len(pids) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("records %v not all delivered within 10 s: %v", pids, got)
			}
			<-time.After(2 * time.Millisecond)
		}
	}
	ctx1, stop1 := context.WithCancel(ctx)
	a, b := follow(ctx1, "replica-a"), follow(ctx1, "replica-b")
	waitGroup()
	for pid := uint32(2); pid <= 9; pid++ {
		if err := st.AddAudit(ctx, rec(pid)); err != nil {
			t.Fatal(err)
		}
	}
	delivered(2, 3, 4, 5, 6, 7, 8, 9)
	stop1()
	for _, done := range []<-chan error{a, b} {
		if err := <-done; err != nil {
			t.Errorf("FollowAudit: %v", err)
		}
	}
	if err := st.AddAudit(ctx, rec(10)); err != nil { // while no follower runs
		t.Fatal(err)
	}
	ctx2, stop2 := context.WithCancel(ctx)
	c := follow(ctx2, "replica-c")
	delivered(10)
	stop2()
	if err := <-c; err != nil {
		t.Errorf("FollowAudit: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got[1]) != 0 {
		t.Errorf("a record from before the group was delivered to %v", got[1])
	}
	for pid := uint32(2); pid <= 10; pid++ {
		if len(got[pid]) != 1 {
			t.Errorf("record %d delivered to %v, want exactly one consumer", pid, got[pid])
		}
	}
	if !failedOnce || got[10][0] != "replica-c" {
		t.Errorf("failed once %v; record 10 went to %v, want replica-c", failedOnce, got[10])
	}
	if pending, err := rdb.XPending(ctx, st.Keys().AgentAudit(), "broker-events").Result(); err != nil || pending.Count != 0 {
		t.Errorf("pending %+v, %v; want every record acknowledged", pending, err)
	}
}
