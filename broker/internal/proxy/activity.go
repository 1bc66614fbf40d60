package proxy

import (
	"context"
	"sync"
	"time"

	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// forgetAfter is how long a spawn without open WebSockets and without
// requests stays in the tracker.
const forgetAfter = time.Hour

// tracker keeps, per spawn, the last proxied request and the open
// WebSockets of this replica. Safe for concurrent use.
type tracker struct {
	mu    sync.Mutex
	spawn map[string]*spawnActivity
}

type spawnActivity struct {
	last    time.Time
	open    int
	changed bool // since the last flush
}

func newTracker() *tracker { return &tracker{spawn: map[string]*spawnActivity{}} }

// begin records a request of spawnID at now; for a WebSocket it counts it
// open until the returned function is called (with the clock, at its end).
func (t *tracker) begin(spawnID string, now time.Time, websocket bool) func(func() time.Time) {
	t.mu.Lock()
	a := t.spawn[spawnID]
	if a == nil {
		a = &spawnActivity{}
		t.spawn[spawnID] = a
	}
	if now.After(a.last) {
		a.last = now
	}
	if websocket {
		a.open++
	}
	a.changed = true
	t.mu.Unlock()
	if !websocket {
		return func(func() time.Time) {}
	}
	return func(clock func() time.Time) {
		t.mu.Lock()
		defer t.mu.Unlock()
		a.open--
		if end := clock(); end.After(a.last) {
			a.last = end // the socket's traffic lasted until now
		}
		a.changed = true
	}
}

// Activity returns what this replica saw of spawnID; ok is false when it
// saw nothing.
func (p *Proxy) Activity(spawnID string) (fleet.ProxyActivity, bool) {
	p.activity.mu.Lock()
	defer p.activity.mu.Unlock()
	a, ok := p.activity.spawn[spawnID]
	if !ok {
		return fleet.ProxyActivity{}, false
	}
	return fleet.ProxyActivity{LastRequest: a.last.UTC(), OpenWebSockets: a.open}, true
}

// snapshot returns the changed spawns' activity and forgets spawns quiet
// for forgetAfter. Spawns with open WebSockets are always included, so
// their records stay fresh.
func (t *tracker) snapshot(now time.Time) map[string]fleet.ProxyActivity {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[string]fleet.ProxyActivity{}
	for id, a := range t.spawn {
		if a.changed || a.open > 0 {
			out[id] = fleet.ProxyActivity{LastRequest: a.last.UTC(), OpenWebSockets: a.open}
			a.changed = false
		} else if now.Sub(a.last) > forgetAfter {
			delete(t.spawn, id)
		}
	}
	return out
}

// Run writes this replica's activity to the activity store every
// Config.ActivityFlush until ctx ends (then once more). Without a store it
// only returns when ctx ends. Store failures are logged and retried on
// the next flush.
func (p *Proxy) Run(ctx context.Context) error {
	if p.deps.Activity == nil {
		<-ctx.Done()
		return nil
	}
	t := time.NewTicker(p.cfg.ActivityFlush)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			p.flush(fctx)
			cancel()
			return nil
		case <-t.C:
			p.flush(ctx)
		}
	}
}

// flush writes the changed spawns' activity, stamped with the time of
// writing: readers count a replica's open WebSockets only while its stamp
// is recent (reclaim.Config.ProxyFresh: three flush intervals), so a replica that died drops out of the sums.
func (p *Proxy) flush(ctx context.Context) {
	now := p.now()
	for id, a := range p.activity.snapshot(now) {
		if err := p.deps.Activity.PutActivity(ctx, id, p.cfg.Replica, a, now); err != nil {
			p.log.WarnContext(ctx, "notebook proxy: activity not written; retrying on the next flush", "spawn_id", id, "err", err)
			p.activity.mu.Lock()
			if s := p.activity.spawn[id]; s != nil {
				s.changed = true
			}
			p.activity.mu.Unlock()
		}
	}
}
