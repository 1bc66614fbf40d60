package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/e2e/harness"
	"github.com/gpubroker/gpubroker/spawner"
)

// hubBenchSpawns is how many spawns each side makes, one at a time.
const hubBenchSpawns = 15

// BenchmarkHubSpawn puts a spawn through JupyterHub with GPUBrokerSpawner
// next to a spawn through the broker's own API, for the same profile
// (small) on the same broker, hub and pod runner, in one run, taking turns:
//
//   - hub: POST /hub/api/users/bench/server until the hub calls the server
//     ready (its answer 201, or 202 and then GET until ready): the class's
//     start() (profile, PUT, the event stream until running) and the hub's
//     own wait for the notebook to answer HTTP;
//   - broker: PUT the server, its event stream until running, then GET the
//     notebook's /api at its URL every 10 ms until it answers 200: the
//     broker's own spawn and the same wait for HTTP.
//
// Both run a real notebook process (jupyterhub-singleuser through the hub,
// the classic notebook server through the broker's API), so the difference
// is the hub and the class plus what singleuser does at start (it asks the
// hub for its version). Each server is stopped, untimed, before the next
// spawn. It reports p50 and p99 of both and the latency the hub path adds.
//
//	go tool task bench:hub
func BenchmarkHubSpawn(b *testing.B) {
	h := newHubEnv(b, envOptions{})
	ctx := b.Context()
	cl := h.client("bench", "ml")
	hc := &http.Client{Timeout: 5 * time.Second, Transport: http.DefaultTransport.(*http.Transport).Clone()}
	defer hc.CloseIdleConnections()
	b.ResetTimer()
	for range b.N {
		var hubReady, hubRunning, hubCreated, brokerHTTP, brokerRunning spawnRun
		add := func(r *spawnRun, d time.Duration) { r.latencies = append(r.latencies, d); r.wall += d }
		for i := range hubBenchSpawns {
			running, ready, err := h.brokerSpawnToHTTP(ctx, cl, hc, fmt.Sprintf("nb%d", i))
			if err != nil {
				b.Fatalf("broker spawn %d: %v", i, err)
			}
			add(&brokerRunning, running)
			add(&brokerHTTP, ready)
			created, running, ready, err := h.hubSpawnToReady(ctx, cl, "bench")
			if err != nil {
				b.Fatalf("hub spawn %d: %v", i, err)
			}
			add(&hubCreated, created)
			add(&hubRunning, running)
			add(&hubReady, ready)
			h.stopHub(b, "bench")
		}
		b.ReportMetric(ms(hubReady.quantile(0.50)), "hub-p50-ms")
		b.ReportMetric(ms(hubReady.quantile(0.99)), "hub-p99-ms")
		b.ReportMetric(ms(brokerHTTP.quantile(0.50)), "broker-p50-ms")
		b.ReportMetric(ms(brokerHTTP.quantile(0.99)), "broker-p99-ms")
		b.ReportMetric(float64(hubReady.quantile(0.50))/float64(brokerHTTP.quantile(0.50)), "hub/broker-p50-ratio")
		line := func(what string, r spawnRun) {
			b.Logf("%-44s p50 %6.0f ms  p99 %6.0f ms", what, ms(r.quantile(0.5)), ms(r.quantile(0.99)))
		}
		b.Logf("%d spawns each, one at a time, taking turns; profile small; real notebooks", hubBenchSpawns)
		line("hub: POST → the hub calls it ready", hubReady)
		line("broker's API: PUT → the notebook answers", brokerHTTP)
		line("hub: POST → the broker says running", hubRunning)
		line("broker's API: PUT → the broker says running", brokerRunning)
		line("hub: POST → the broker has the spawn", hubCreated)
		b.Logf("added by the hub path: p50 %+.0f ms, p99 %+.0f ms (ratio p50 %.2f); before running %+.0f ms at p50, of it %.0f ms before the broker has the spawn (the hub and the class), the rest jupyterhub-singleuser's slower start",
			ms(hubReady.quantile(0.5)-brokerHTTP.quantile(0.5)), ms(hubReady.quantile(0.99)-brokerHTTP.quantile(0.99)),
			float64(hubReady.quantile(0.50))/float64(brokerHTTP.quantile(0.50)),
			ms(hubRunning.quantile(0.5)-brokerRunning.quantile(0.5)), ms(hubCreated.quantile(0.5)))
	}
}

// hubSpawnToReady asks the hub for user's default server (profile small)
// and returns the times until the broker has the new spawn and until it
// says the spawn runs (both read every 20 ms), and until the hub calls the
// server ready.
func (h *hubEnv) hubSpawnToReady(ctx context.Context, cl *harness.Client, user string) (created, running, ready time.Duration, err error) {
	before, _, err := h.brokerServer(ctx, user)
	if err != nil {
		return 0, 0, 0, err
	}
	start := time.Now()
	seen, made := make(chan time.Duration, 1), make(chan time.Duration, 1)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		_ = harness.Poll(wctx, 20*time.Millisecond, 2*time.Minute, func(ctx context.Context) (bool, string, error) {
			s, err := cl.GetServer(ctx, user, hubDefaultServer)
			if err != nil || s.SpawnID == before.SpawnID {
				return false, fmt.Sprint(s.State, err), nil
			}
			select {
			case made <- time.Since(start):
			default:
			}
			if s.State == v1.StateRunning {
				seen <- time.Since(start)
				return true, "", nil
			}
			return false, string(s.State), nil
		})
	}()
	status, err := h.spawn(ctx, user, "small")
	if err != nil {
		return 0, 0, 0, err
	}
	if status == http.StatusAccepted {
		if err := h.waitHubReady(ctx, user, 2*time.Minute); err != nil {
			return 0, 0, 0, err
		}
	}
	ready = time.Since(start)
	select {
	case running = <-seen:
	case <-time.After(time.Minute):
		return 0, 0, 0, fmt.Errorf("the broker never reported %s's new spawn running", user)
	}
	return <-made, running, ready, nil
}

// brokerSpawnToHTTP creates server name through the broker's API, follows
// its events until running, waits until the notebook answers HTTP at its
// URL and returns the times until running and until that answer; then it
// stops the server (untimed) and waits until the broker says stopped.
func (h *hubEnv) brokerSpawnToHTTP(ctx context.Context, cl *harness.Client, hc *http.Client, name string) (running, ready time.Duration, err error) {
	start := time.Now()
	if _, _, err := cl.CreateServer(ctx, "bench", name, "", v1.CreateServerRequest{Profile: "small"}); err != nil {
		return 0, 0, err
	}
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	stream, err := cl.Events(sctx, "bench", name, "")
	if err != nil {
		return 0, 0, err
	}
	var url string
	for url == "" {
		ev, err := stream.Next()
		if err != nil {
			stream.Close()
			return 0, 0, fmt.Errorf("events of bench/%s: %w", name, err)
		}
		switch ev.State {
		case v1.StateFailed:
			stream.Close()
			return 0, 0, fmt.Errorf("bench/%s failed: %s", name, ev.Message)
		case v1.StateRunning:
			running = time.Since(start)
			s, err := cl.GetServer(ctx, "bench", name)
			if err != nil {
				stream.Close()
				return 0, 0, err
			}
			url = strings.TrimSuffix(s.URL, "/") + spawner.BaseURL("bench", name) + "api"
		}
	}
	stream.Close()
	err = harness.Poll(sctx, 10*time.Millisecond, time.Minute, func(ctx context.Context) (bool, string, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := hc.Do(req)
		if err != nil {
			return false, err.Error(), nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status, nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("the notebook of bench/%s at %s: %w", name, url, err)
	}
	ready = time.Since(start)
	if _, err := cl.DeleteServer(ctx, "bench", name); err != nil {
		return 0, 0, err
	}
	if _, err := cl.WaitServer(ctx, "bench", name, v1.StateStopped, time.Minute); err != nil {
		return 0, 0, err
	}
	return running, ready, nil
}
