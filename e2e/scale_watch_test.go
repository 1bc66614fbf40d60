package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/e2e/harness"
)

// watchReport is the event-stream fan-out.
type watchReport struct {
	open          time.Duration
	perWatcherKiB float64
	redisConns    int64     // Redis client connections the watchers added
	rssAfter      []float64 // each replica's RSS in MiB with the watchers open
	each          []time.Duration
	all           []time.Duration
}

// fanOut opens cfg.watchers event streams of user's server name, spread
// over the replicas, measures the replicas' RSS and the Redis connections
// they added, then resizes the server cfg.events times (each resize is one
// event) and measures how long each event took to reach each watcher.
func fanOut(ctx context.Context, tb testing.TB, e *env, replicas []*harness.Broker, user, name string, cfg scaleConfig) (watchReport, error) {
	var r watchReport
	rdb := e.redis.Client(tb)
	conns := func() (int64, error) {
		info, err := rdb.Info(ctx, "clients").Result()
		if err != nil {
			return 0, err
		}
		for line := range strings.SplitSeq(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "connected_clients:"); ok {
				var n int64
				_, err := fmt.Sscan(v, &n)
				return n, err
			}
		}
		return 0, errors.New("INFO clients: no connected_clients")
	}
	rss := func() ([]float64, float64, error) {
		var sum float64
		out := make([]float64, len(replicas))
		for i, b := range replicas {
			kib, err := harness.ProcRSS(b.Pid())
			if err != nil {
				return nil, 0, err
			}
			out[i] = float64(kib) / 1024
			sum += float64(kib)
		}
		return out, sum, nil
	}
	_, rss0, err := rss()
	if err != nil {
		return r, err
	}
	c0, err := conns()
	if err != nil {
		return r, err
	}
	admins := make([]*harness.Client, len(replicas))
	tok := e.token("watch-admin", adminGroup)
	for i, b := range replicas {
		admins[i] = &harness.Client{BaseURL: b.URL, Token: tok}
	}
	start := time.Now()
	w, err := harness.OpenWatchers(ctx, admins, user, name, cfg.watchers)
	if err != nil {
		return r, err
	}
	defer w.Close()
	r.open = time.Since(start)
	// The replays of the server's past events have reached every watcher
	// once its running event has.
	if _, err := w.WaitEvent(ctx, time.Time{}, time.Minute); err != nil {
		return r, fmt.Errorf("replay: %w", err)
	}
	var sum1 float64
	if r.rssAfter, sum1, err = rss(); err != nil {
		return r, err
	}
	c1, err := conns()
	if err != nil {
		return r, err
	}
	r.perWatcherKiB = (sum1 - rss0) / float64(cfg.watchers)
	r.redisConns = c1 - c0
	owner := &harness.Client{BaseURL: replicas[0].URL, Token: e.token(user, "ml")}
	for i := range cfg.events {
		limit := 20 - 10*(i%2) // the profile's 10 %, so every resize changes it
		t0 := time.Now()
		var out v1.ResizeResult
		if _, err := owner.Do(ctx, http.MethodPatch, harness.ServerPath(user, name)+"/slice", v1.ResizeRequest{ComputeLimitPercent: &limit}, nil, &out); err != nil {
			return r, fmt.Errorf("resize %d: %w", i, err)
		}
		f, err := w.WaitEvent(ctx, t0, time.Minute)
		if err != nil {
			return r, fmt.Errorf("event of resize %d: %w", i, err)
		}
		r.each = append(r.each, f.Latencies...)
		r.all = append(r.all, f.All())
	}
	return r, nil
}
