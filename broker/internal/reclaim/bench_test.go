package reclaim_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/gpubroker/gpubroker/broker/api/redisschema"
	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/internal/reclaim"
	"github.com/gpubroker/gpubroker/broker/internal/redisstore"
	"github.com/gpubroker/gpubroker/broker/redistest"
	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
)

// failProber fails every probe: in the benchmark every GPU is busy, so a
// probe would be a defect.
type failProber struct{}

func (failProber) Probe(context.Context, fleet.Server) (reclaim.Activity, error) {
	return reclaim.Activity{}, fmt.Errorf("unexpected probe: %d", http.StatusTeapot)
}

// BenchmarkCycle10k runs one reclaim cycle over 10,000 running servers
// whose agents report a busy GPU (30 samples each in a real redis-server),
// and compares it with a raw pipeline read of the same keys (the server
// set and records, the newest 30 samples and the idle state of each
// spawn). ratio = raw time / cycle time (target >= 0.5).
func BenchmarkCycle10k(b *testing.B) {
	const n, perServer = 10000, 30
	rs := redistest.Start(b)
	rdb := rs.Client(b)
	prefix := rs.Prefix(b)
	c := &clock{now: t0}
	ctx := b.Context()
	store := redisstore.New(rdb, prefix, redisstore.WithClock(c.Now))
	agents := agentstore.New(rdb, prefix)
	states := redisstore.NewReclaim(rdb, prefix)
	policies := reclaim.NewPolicies(states, c.Now)
	p := stopPolicy()
	if _, err := policies.Put(ctx, p, "admin"); err != nil {
		b.Fatal(err)
	}
	var samples []agentstore.Sample
	for i := range n {
		spawn := fmt.Sprintf("spawn-%05d", i)
		srv := fleet.Server{ServerKey: fleet.ServerKey{User: fmt.Sprintf("user-%04d", i/3), Name: fmt.Sprintf("s%d", i%3)},
			Profile: "small", SpawnID: spawn, State: v1.StateRunning, Slice: slice, URL: "http://127.0.0.1:1/",
			Allocation: &fleet.Allocation{SliceID: spawn, Slice: slice, GPUUUID: "GPU-1", Node: "n1"}}
		if _, err := store.RestoreServer(ctx, srv); err != nil {
			b.Fatal(err)
		}
		zero := time.Time{}
		for j := range perServer {
			sm := 50 + j
			samples = append(samples, agentstore.Sample{Slice: spawn, At: t0.Add(time.Duration(j-perServer) * time.Second),
				Interval: 10 * time.Second, SMPercent: &sm, LastKernel: &zero})
		}
		if len(samples) >= 30000 {
			if err := agents.AddSamples(ctx, samples); err != nil {
				b.Fatal(err)
			}
			samples = samples[:0]
		}
	}
	if err := agents.AddSamples(ctx, samples); err != nil {
		b.Fatal(err)
	}
	rec, err := reclaim.New(reclaim.Config{Policies: policies, Audit: redisstore.NewAuditLog(rdb, prefix, nil), States: states,
		Samples: redisstore.AgentSamples{Agents: agents}, Servers: store,
		Stopper: &stopper{store: store}, Shrinker: quotaShrinker(agents), Prober: failProber{},
		SamplesPerServer: perServer, Now: c.Now})
	if err != nil {
		b.Fatal(err)
	}
	cycle := func() {
		rep, err := rec.Cycle(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if rep.Servers != n || rep.Active != n {
			b.Fatalf("cycle saw %+v, want %d active servers", rep, n)
		}
	}
	cycle() // the first cycle writes every spawn's state once

	// The raw read: the same keys, pipelined in one round of batches.
	setKey := redisschema.New(prefix).AllServers()
	raw := func() {
		members, err := rdb.SMembers(ctx, setKey).Result()
		if err != nil || len(members) != n {
			b.Fatalf("raw: %d members, %v", len(members), err)
		}
		const batch = 1000
		for lo := 0; lo < n; lo += batch {
			hi := min(lo+batch, n)
			if _, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				for i := lo; i < hi; i++ {
					p.HGetAll(ctx, members[i])
				}
				return nil
			}); err != nil {
				b.Fatal(err)
			}
		}
		for lo := 0; lo < n; lo += batch {
			hi := min(lo+batch, n)
			if _, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				for i := lo; i < hi; i++ {
					spawn := fmt.Sprintf("spawn-%05d", i)
					p.XRevRangeN(ctx, agents.Keys().Samples(spawn), "+", "-", perServer)
					p.HGetAll(ctx, redisschema.New(prefix).IdleState(spawn))
				}
				return nil
			}); err != nil {
				b.Fatal(err)
			}
		}
	}
	var tCycle, tRaw time.Duration
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		raw()
		tRaw += time.Since(start)
		start = time.Now()
		cycle()
		tCycle += time.Since(start)
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(b.N) / float64(time.Millisecond) }
	ratio := float64(tRaw) / float64(tCycle)
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(ms(tCycle), "cycle-ms")
	b.ReportMetric(ms(tRaw), "raw-ms")
	b.ReportMetric(ratio, "ratio")
	b.Logf("servers=%d samples/server=%d: cycle %.1f ms, raw pipeline read %.1f ms, ratio %.2f (target >= 0.5)", n, perServer, ms(tCycle), ms(tRaw), ratio)
}
