package proxy

import (
	"sync"
	"time"
)

// cacheLimit bounds each of the proxy's caches; a full cache is cleared.
const cacheLimit = 8192

// ttlCache keeps values until a time given with each. Safe for concurrent
// use.
type ttlCache[K comparable, V any] struct {
	mu sync.Mutex
	m  map[K]ttlEntry[V]
}

type ttlEntry[V any] struct {
	v     V
	until time.Time
}

func newTTLCache[K comparable, V any]() *ttlCache[K, V] {
	return &ttlCache[K, V]{m: map[K]ttlEntry[V]{}}
}

// get returns k's value while now is before its time.
func (c *ttlCache[K, V]) get(k K, now time.Time) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[k]
	if !ok || !now.Before(e.until) {
		delete(c.m, k)
		var zero V
		return zero, false
	}
	return e.v, true
}

// put keeps v as k's value until until.
func (c *ttlCache[K, V]) put(k K, v V, until time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) >= cacheLimit {
		clear(c.m)
	}
	c.m[k] = ttlEntry[V]{v: v, until: until}
}

// drop forgets k.
func (c *ttlCache[K, V]) drop(k K) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, k)
}
