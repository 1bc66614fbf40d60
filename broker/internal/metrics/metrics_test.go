package metrics_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/gpubroker/gpubroker/broker/internal/metrics"
	"github.com/gpubroker/gpubroker/broker/internal/reclaim"
	"github.com/gpubroker/gpubroker/broker/internal/reconcile"
	"github.com/gpubroker/gpubroker/broker/internal/servers"
	"github.com/gpubroker/gpubroker/broker/redistest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).reaper"))
}

func newBroker(t *testing.T, o metrics.Options) (*metrics.Broker, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	b, err := metrics.New(reg, o)
	if err != nil {
		t.Fatal(err)
	}
	return b, reg
}

func TestNewRefusesASecondRegistrationOnTheSameRegistry(t *testing.T) {
	_, reg := newBroker(t, metrics.Options{})
	if _, err := metrics.New(reg, metrics.Options{}); err == nil {
		t.Error("a second New on the same registry succeeded; want a duplicate-registration error")
	}
}

// TestLabelValuesAreTheConsumers keeps the pre-initialised label values
// equal to what the lifecycle, the reconciler and the reclaimer report.
func TestLabelValuesAreTheConsumers(t *testing.T) {
	if diff := cmp.Diff(metrics.SpawnOutcomes, []string{servers.OutcomeRunning, servers.OutcomeFailed, servers.OutcomeRefused}); diff != "" {
		t.Errorf("spawn outcomes (-metrics +servers):\n%s", diff)
	}
	var kinds []string
	for k := range (reconcile.Report{}).Repairs() {
		kinds = append(kinds, k)
	}
	if diff := cmp.Diff(sorted(metrics.RepairKinds), sorted(kinds)); diff != "" {
		t.Errorf("repair kinds (-metrics +reconcile):\n%s", diff)
	}
	for _, err := range []error{errors.New("x")} {
		if r := servers.Refusal(err); !slices.Contains(metrics.PlacementRefusals, r) {
			t.Errorf("servers.Refusal gives %q, not among %v", r, metrics.PlacementRefusals)
		}
	}
	reasons := map[reclaim.Verdict][]string{
		reclaim.VerdictIdle:    {""},
		reclaim.VerdictActive:  {"the GPU is busy", "GPU kernels were launched recently", "a kernel is running code", "the notebook was used recently", "started recently (minimum running time)"},
		reclaim.VerdictUnknown: {"the node agent has reported no GPU samples for this server", "the GPU samples are stale (the newest is from 10:00:00 UTC)", "GPU utilization is unknown: nvml", "notebook activity probe failed: 502"},
	}
	seen := map[string]bool{}
	for v, rs := range reasons {
		for _, r := range rs {
			c := reclaim.ReasonClass(v, r)
			if !slices.Contains(metrics.ReclaimVerdictReasons, c) {
				t.Errorf("ReasonClass(%s, %q) = %q, not among %v", v, r, c, metrics.ReclaimVerdictReasons)
			}
			seen[c] = true
		}
	}
	if len(seen) != len(metrics.ReclaimVerdictReasons) {
		t.Errorf("the reasons map to %d classes, want all %d", len(seen), len(metrics.ReclaimVerdictReasons))
	}
}

func sorted(s []string) []string { s = slices.Clone(s); slices.Sort(s); return s }

// TestKnownSeriesStartAtZero: before anything happened, a rate over the
// spawn, refusal, repair and reclaim series has something to work on.
func TestKnownSeriesStartAtZero(t *testing.T) {
	_, reg := newBroker(t, metrics.Options{Profiles: []string{"small", "large"}})
	tests := []struct {
		name string
		want int
	}{
		{"gpubroker_spawn_duration_seconds", 2 * len(metrics.SpawnOutcomes)},
		{"gpubroker_placement_refusals_total", len(metrics.PlacementRefusals)},
		{"gpubroker_reconcile_repairs_total", len(metrics.RepairKinds)},
		{"gpubroker_reclaim_actions_total", len(metrics.ReclaimActions) * len(metrics.ReclaimReasons) * len(metrics.ReclaimModes)},
		{"gpubroker_reclaim_decisions_total", len(metrics.ReclaimVerdictReasons)},
		{"gpubroker_reclaim_freed_gpu_seconds_total", len(metrics.FreedActions)},
	}
	for _, tc := range tests {
		n, err := testutil.GatherAndCount(reg, tc.name)
		if err != nil {
			t.Fatal(err)
		}
		if n != tc.want {
			t.Errorf("%s has %d series, want %d", tc.name, n, tc.want)
		}
	}
}

func TestObservations(t *testing.T) {
	b, reg := newBroker(t, metrics.Options{Version: "v1.2.3"})
	b.ObservePlacement(3*time.Millisecond, "")
	b.ObservePlacement(2*time.Millisecond, "capacity")
	b.ObserveSpawn("small", "running", 1500*time.Millisecond)
	b.ObserveReconcile(10*time.Millisecond, map[string]int{"restored_slice": 2, "deleted_pod": 0}, false)
	b.ObserveReconcile(10*time.Millisecond, nil, true)
	b.ObserveCycle(time.Millisecond, false)
	b.ObserveDecision("idle", "idle")
	b.ObserveAction("stop", "idle", true)
	b.ObserveFreed(0.5, 0.25, 30*time.Second)
	b.ObserveFreed(0.5, 0, 30*time.Second)
	b.ObserveRequest("PUT", "/api/v1/users/:user/servers/:name", 201, 20*time.Millisecond, false)
	b.ObserveRequest("GET", "", 404, time.Millisecond, false)
	b.ObserveRequest("GET", "/api/v1/users/:user/servers/:name/events", 200, time.Minute, true)
	b.StreamOpened()
	b.StreamOpened()
	b.StreamClosed()
	b.ProxyOpened()
	b.SetLeader(true)
	b.SetDependencyUp("redis", false)
	want := `
# HELP gpubroker_build_info Always 1; the version label is the broker's build.
# TYPE gpubroker_build_info gauge
gpubroker_build_info{version="v1.2.3"} 1
# HELP gpubroker_event_streams Server event streams (SSE) open on this replica.
# TYPE gpubroker_event_streams gauge
gpubroker_event_streams 1
# HELP gpubroker_proxy_connections Connections to notebooks the broker's proxy holds open on this replica.
# TYPE gpubroker_proxy_connections gauge
gpubroker_proxy_connections 1
# HELP gpubroker_reclaim_leader 1 while this replica holds the reclaimer's Lease (or runs the reclaimer without election), else 0; the holder also makes the periodic reconcile passes.
# TYPE gpubroker_reclaim_leader gauge
gpubroker_reclaim_leader 1
# HELP gpubroker_reclaim_freed_gpus Guaranteed GPU compute the reclaimer holds freed at its last cycle, in GPUs (a 25 % slice is 0.25), by action: stop (servers it stopped that were not started again) and shrink (compute taken from shrunk servers).
# TYPE gpubroker_reclaim_freed_gpus gauge
gpubroker_reclaim_freed_gpus{action="shrink"} 0
gpubroker_reclaim_freed_gpus{action="stop"} 0.5
# HELP gpubroker_reclaim_freed_gpu_seconds_total GPU time the reclaimer freed, GPU-seconds: gpubroker_reclaim_freed_gpus integrated over the cycles, by action; divide an increase by 3600 for GPU-hours.
# TYPE gpubroker_reclaim_freed_gpu_seconds_total counter
gpubroker_reclaim_freed_gpu_seconds_total{action="shrink"} 7.5
gpubroker_reclaim_freed_gpu_seconds_total{action="stop"} 30
# HELP gpubroker_reconcile_passes_total Reconcile passes, by result (ok, error).
# TYPE gpubroker_reconcile_passes_total counter
gpubroker_reconcile_passes_total{result="error"} 1
gpubroker_reconcile_passes_total{result="ok"} 1
# HELP gpubroker_dependency_up 1 when the dependency answered this replica's last readiness check (every few seconds, as /readyz), else 0; by dependency (redis, kubernetes, oidc).
# TYPE gpubroker_dependency_up gauge
gpubroker_dependency_up{dependency="redis"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "gpubroker_build_info", "gpubroker_event_streams",
		"gpubroker_proxy_connections", "gpubroker_reclaim_leader", "gpubroker_reclaim_freed_gpus",
		"gpubroker_reclaim_freed_gpu_seconds_total", "gpubroker_reconcile_passes_total", "gpubroker_dependency_up"); err != nil {
		t.Error(err)
	}
	counts := []struct {
		name   string
		labels prometheus.Labels
		want   float64
	}{
		{"gpubroker_placement_refusals_total", prometheus.Labels{"reason": "capacity"}, 1},
		{"gpubroker_reconcile_repairs_total", prometheus.Labels{"kind": "restored_slice"}, 2},
		{"gpubroker_reclaim_actions_total", prometheus.Labels{"action": "stop", "reason": "idle", "mode": "dry_run"}, 1},
		{"gpubroker_reclaim_actions_total", prometheus.Labels{"action": "stop", "reason": "idle", "mode": "enforce"}, 0},
		{"gpubroker_http_requests_total", prometheus.Labels{"method": "GET", "route": "unmatched", "code": "404"}, 1},
		{"gpubroker_http_requests_total", prometheus.Labels{"method": "GET", "route": "/api/v1/users/:user/servers/:name/events", "code": "200"}, 1},
	}
	for _, c := range counts {
		if got := value(t, reg, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	// The event stream is counted, never timed.
	if n := histogramCount(t, reg, "gpubroker_http_request_duration_seconds", prometheus.Labels{"route": "/api/v1/users/:user/servers/:name/events"}); n != 0 {
		t.Errorf("the event stream was timed %d times, want 0", n)
	}
	if n := histogramCount(t, reg, "gpubroker_spawn_duration_seconds", prometheus.Labels{"profile": "small", "outcome": "running"}); n != 1 {
		t.Errorf("%d running spawns of small observed, want 1", n)
	}
}

func TestFleetSeriesFollowTheLastSnapshot(t *testing.T) {
	b, reg := newBroker(t, metrics.Options{UserLabels: true})
	at := time.Unix(1_800_000_000, 500_000_000)
	b.SetFleet(metrics.Fleet{
		GPUs: []metrics.GPU{
			{UUID: "GPU-a", Node: "n1", Model: "H100", MemoryMiB: 81559, AllocatedMiB: 16384, AllocatedComputePercent: 20, Slices: 2, Healthy: true},
			{UUID: "GPU-b", Node: "n2", Model: "H100", MemoryMiB: 81559},
		},
		Servers: []metrics.Server{
			{User: "alice", State: "running", Profile: "small", MemoryMiB: 8192, ComputePercent: 10},
			{User: "bob", State: "running", Profile: "small", MemoryMiB: 8192, ComputePercent: 10},
			{User: "bob", State: "stopped", Profile: "small"},
		},
		Nodes: []metrics.Node{{Name: "n1", LastHeartbeat: at}},
	})
	checks := []struct {
		name   string
		labels prometheus.Labels
		want   float64
	}{
		{"gpubroker_servers", prometheus.Labels{"state": "running", "profile": "small"}, 2},
		{"gpubroker_servers", prometheus.Labels{"state": "stopped", "profile": "small"}, 1},
		{"gpubroker_gpu_memory_capacity_bytes", prometheus.Labels{"gpu": "GPU-a"}, 81559 << 20},
		{"gpubroker_gpu_memory_allocated_bytes", prometheus.Labels{"gpu": "GPU-a"}, 16384 << 20},
		{"gpubroker_gpu_compute_allocated_percent", prometheus.Labels{"gpu": "GPU-a"}, 20},
		{"gpubroker_gpu_healthy", prometheus.Labels{"gpu": "GPU-b"}, 0},
		{"gpubroker_node_last_report_timestamp_seconds", prometheus.Labels{"node": "n1"}, 1_800_000_000.5},
		{"gpubroker_user_servers", prometheus.Labels{"user": "bob", "state": "running"}, 1},
		{"gpubroker_user_gpu_memory_allocated_bytes", prometheus.Labels{"user": "bob"}, 8192 << 20},
	}
	for _, c := range checks {
		if got := value(t, reg, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	b.SetFleet(metrics.Fleet{GPUs: []metrics.GPU{{UUID: "GPU-a", Node: "n1", Model: "H100", MemoryMiB: 81559}}})
	for name, want := range map[string]int{"gpubroker_servers": 0, "gpubroker_gpu_memory_capacity_bytes": 1, "gpubroker_node_last_report_timestamp_seconds": 0, "gpubroker_user_servers": 0} {
		if n, err := testutil.GatherAndCount(reg, name); err != nil || n != want {
			t.Errorf("%s: %d series after a smaller snapshot (err %v), want %d", name, n, err, want)
		}
	}
}

func TestNoUserSeriesWithoutTheOption(t *testing.T) {
	b, reg := newBroker(t, metrics.Options{})
	b.SetFleet(metrics.Fleet{Servers: []metrics.Server{{User: "alice", State: "running", Profile: "small"}}})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "user" || l.GetValue() == "alice" {
					t.Errorf("%s carries the user (%s=%q) without UserLabels", mf.GetName(), l.GetName(), l.GetValue())
				}
			}
		}
	}
}

func TestRedisHookCountsCommandsAndFailures(t *testing.T) {
	b, reg := newBroker(t, metrics.Options{})
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	rdb.AddHook(b.RedisHook())
	ctx := t.Context()
	if err := rdb.Get(ctx, srv.Prefix(t)+"missing").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("GET missing = %v, want redis.Nil", err)
	}
	key := srv.Prefix(t) + "list"
	if err := rdb.RPush(ctx, key, "x").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Get(ctx, key).Err(); err == nil {
		t.Fatal("GET of a list succeeded; want WRONGTYPE")
	}
	script := redis.NewScript("return 1")
	if err := script.Run(ctx, rdb, nil).Err(); err != nil { // NOSCRIPT first, then EVAL
		t.Fatal(err)
	}
	if _, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Get(ctx, key)
		p.Get(ctx, srv.Prefix(t)+"missing")
		return nil
	}); err == nil {
		t.Fatal("pipeline with a WRONGTYPE succeeded")
	}
	if got := value(t, reg, "gpubroker_redis_errors_total", prometheus.Labels{"command": "get"}); got != 2 {
		t.Errorf("get errors = %v, want 2 (one alone, one in a pipeline; missing keys are no errors)", got)
	}
	if n, _ := testutil.GatherAndCount(reg, "gpubroker_redis_errors_total"); n != 1 {
		t.Errorf("%d error series, want only get's (NOSCRIPT and the connection handshake are no errors)", n)
	}
	if got := value(t, reg, "gpubroker_redis_commands_total", prometheus.Labels{"command": "get"}); got != 4 {
		t.Errorf("get commands = %v, want 4 (two alone, two in a pipeline; failed or not)", got)
	}
	if got := value(t, reg, "gpubroker_redis_commands_total", prometheus.Labels{"command": "rpush"}); got != 1 {
		t.Errorf("rpush commands = %v, want 1", got)
	}
}

// TestRedisPoolSeriesCountWaits: with a pool of one connection held by a
// blocking read, the next command waits for it, and the pool's series say
// so at the next scrape.
func TestRedisPoolSeriesCountWaits(t *testing.T) {
	b, reg := newBroker(t, metrics.Options{})
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, PoolSize: 1})
	t.Cleanup(func() { _ = rdb.Close() })
	b.CollectRedisPool("main", rdb)
	ctx := t.Context()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	pool := prometheus.Labels{"pool": "main"}
	if got := value(t, reg, "gpubroker_redis_pool_connections", prometheus.Labels{"pool": "main", "state": "idle"}); got != 1 {
		t.Errorf("idle connections after a PING = %v, want 1", got)
	}
	blocked := make(chan error, 1)
	go func() { blocked <- rdb.BLPop(ctx, 300*time.Millisecond, srv.Prefix(t)+"empty").Err() }()
	deadline := time.Now().Add(10 * time.Second)
	for rdb.PoolStats().IdleConns != 0 { // the BLPOP holds the one connection
		if time.Now().After(deadline) {
			t.Fatal("the blocking read never took the connection")
		}
		time.Sleep(time.Millisecond)
	}
	if got := value(t, reg, "gpubroker_redis_pool_connections", prometheus.Labels{"pool": "main", "state": "in_use"}); got != 1 {
		t.Errorf("connections in use during the blocking read = %v, want 1", got)
	}
	if err := rdb.Ping(ctx).Err(); err != nil { // waits until the BLPOP gives the connection back
		t.Fatal(err)
	}
	if err := <-blocked; !errors.Is(err, redis.Nil) {
		t.Fatalf("BLPOP = %v, want redis.Nil after its timeout", err)
	}
	if got := value(t, reg, "gpubroker_redis_pool_waits_total", pool); got != 1 {
		t.Errorf("waits = %v, want 1 (the PING behind the BLPOP)", got)
	}
	if got := value(t, reg, "gpubroker_redis_pool_wait_seconds_total", pool); got <= 0 {
		t.Errorf("wait seconds = %v, want > 0", got)
	}
	if got := value(t, reg, "gpubroker_redis_pool_timeouts_total", pool); got != 0 {
		t.Errorf("timeouts = %v, want 0", got)
	}
}

func TestKubeTransportCountsRequestsAndFailures(t *testing.T) {
	b, reg := newBroker(t, metrics.Options{})
	codes := []int{200, 404, 429, 503}
	i := 0
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(codes[i%len(codes)])
		i++
	}))
	defer api.Close()
	hc := &http.Client{Transport: b.KubeTransport(http.DefaultTransport)}
	for range codes {
		resp, err := hc.Get(api.URL)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	hc.CloseIdleConnections()
	api.Close()
	if _, err := hc.Get(api.URL); err == nil {
		t.Fatal("GET of a closed server succeeded")
	}
	want := `
# HELP gpubroker_kubernetes_request_errors_total Kubernetes API requests that failed, by HTTP method and code: 429 and 5xx answers, and "none" for requests that got no answer.
# TYPE gpubroker_kubernetes_request_errors_total counter
gpubroker_kubernetes_request_errors_total{code="429",method="GET"} 1
gpubroker_kubernetes_request_errors_total{code="503",method="GET"} 1
gpubroker_kubernetes_request_errors_total{code="none",method="GET"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "gpubroker_kubernetes_request_errors_total"); err != nil {
		t.Error(err)
	}
	if got := value(t, reg, "gpubroker_kubernetes_requests_total", prometheus.Labels{"method": "GET"}); got != 5 {
		t.Errorf("GET requests = %v, want 5 (every request, answered or not)", got)
	}
}

// value returns the value of the one series of name whose labels include
// labels (counter or gauge); it fails t unless exactly one matches.
func value(t *testing.T, g prometheus.Gatherer, name string, labels prometheus.Labels) float64 {
	t.Helper()
	m := one(t, g, name, labels)
	switch {
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	}
	t.Fatalf("%s is neither a counter nor a gauge", name)
	return 0
}

func histogramCount(t *testing.T, g prometheus.Gatherer, name string, labels prometheus.Labels) uint64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if matches(m.GetLabel(), labels) {
				n += m.GetHistogram().GetSampleCount()
			}
		}
	}
	return n
}

type labelPair interface {
	GetName() string
	GetValue() string
}

func matches[L labelPair](have []L, want prometheus.Labels) bool {
	for k, v := range want {
		found := false
		for _, l := range have {
			if l.GetName() == k && l.GetValue() == v {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

func one(t *testing.T, g prometheus.Gatherer, name string, labels prometheus.Labels) *dto.Metric {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var found []*dto.Metric
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if matches(m.GetLabel(), labels) {
				found = append(found, m)
			}
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d series of %s match %v, want 1", len(found), name, labels)
	}
	return found[0]
}
