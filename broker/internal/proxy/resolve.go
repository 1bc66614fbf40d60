package proxy

import (
	"context"
	"errors"
	"sync"
	"time"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/auth"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/spawner"
)

const fleetRunning = v1.StateRunning

// cacheLimit bounds each of the proxy's caches; a full cache is cleared.
const cacheLimit = 8192

// resolve finds the server a notebook path names and checks that pr may
// open it: its owner, or an admin when Config.AdminAccess allows. ok is
// false when there is no such server or pr may not see it (both answer
// 404, so others' servers stay invisible).
func (p *Proxy) resolve(ctx context.Context, t target, pr auth.Principal) (fleet.Server, bool, error) {
	if pr.Hub || pr.User == "" {
		return fleet.Server{}, false, nil
	}
	admin := pr.Admin && p.cfg.AdminAccess
	own := spawner.Slug(pr.User) == t.userSlug
	if !own && !admin {
		return fleet.Server{}, false, nil
	}
	key, ok := p.keys.get(t)
	if !ok {
		var err error
		if key, ok, err = p.findKey(ctx, t, pr.User, own); err != nil || !ok {
			return fleet.Server{}, false, err
		}
		p.keys.put(t, key)
	}
	if key.User != pr.User && !admin {
		return fleet.Server{}, false, nil
	}
	now := p.now()
	if srv, ok := p.records.get(key, now); ok {
		return srv, true, nil
	}
	srv, err := p.deps.Servers.GetServer(ctx, key)
	if errors.Is(err, fleet.ErrNotFound) {
		return fleet.Server{}, false, nil
	}
	if err != nil {
		return fleet.Server{}, false, err
	}
	if srv.State == fleetRunning {
		// Only running records are kept, so a start is seen at once; a
		// stop is seen within recordTTL (the pod goes away meanwhile).
		p.records.put(key, srv, now.Add(recordTTL))
	}
	return srv, true, nil
}

// recordTTL is how long a running server's record is used without reading
// it again.
const recordTTL = time.Second

// recordCache keeps running servers' records for recordTTL.
type recordCache struct {
	mu sync.Mutex
	m  map[fleet.ServerKey]recordEntry
}

type recordEntry struct {
	srv   fleet.Server
	until time.Time
}

func newRecordCache() *recordCache { return &recordCache{m: map[fleet.ServerKey]recordEntry{}} }

func (c *recordCache) get(k fleet.ServerKey, now time.Time) (fleet.Server, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[k]
	if !ok || !now.Before(e.until) {
		delete(c.m, k)
		return fleet.Server{}, false
	}
	return e.srv, true
}

func (c *recordCache) put(k fleet.ServerKey, srv fleet.Server, until time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) >= cacheLimit {
		clear(c.m)
	}
	c.m[k] = recordEntry{srv: srv, until: until}
}

// findKey maps a path's slugs to the raw names: from the pod cache for a
// server with a pod, else from the server records (the caller's own, or
// everyone's for an admin).
func (p *Proxy) findKey(ctx context.Context, t target, user string, own bool) (fleet.ServerKey, bool, error) {
	if mp, ok, err := p.deps.Pods.PodBySlugs(t.userSlug, t.serverSlug); err == nil && ok {
		return fleet.ServerKey{User: mp.User, Name: mp.Server}, true, nil
	}
	owner := user
	if !own {
		owner = "" // an admin opening another user's server
	}
	list, err := p.deps.Servers.ListServers(ctx, owner)
	if err != nil {
		return fleet.ServerKey{}, false, err
	}
	for _, s := range list {
		if spawner.Slug(s.User) == t.userSlug && spawner.Slug(s.Name) == t.serverSlug {
			return s.ServerKey, true, nil
		}
	}
	return fleet.ServerKey{}, false, nil
}

// keyCache remembers which raw names a pair of slugs stands for. Slug is
// injective, so an entry never goes stale.
type keyCache struct {
	mu sync.Mutex
	m  map[target]fleet.ServerKey
}

func newKeyCache() *keyCache { return &keyCache{m: map[target]fleet.ServerKey{}} }

func (c *keyCache) get(t target) (fleet.ServerKey, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k, ok := c.m[t]
	return k, ok
}

func (c *keyCache) put(t target, k fleet.ServerKey) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) >= cacheLimit {
		clear(c.m)
	}
	c.m[t] = k
}

// token returns srv's spawn's notebook token (Tokens caches it).
func (p *Proxy) token(ctx context.Context, srv fleet.Server) (string, error) {
	return p.deps.Tokens.NotebookToken(ctx, srv.User, srv.Name, srv.SpawnID)
}
