package redisstore

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// replicaRefresh is how long a count of online replicas is used before
// INFO is read again.
const replicaRefresh = time.Second

// replicaCount caches the number of replicas online at the master. Safe
// for concurrent use.
type replicaCount struct {
	mu sync.Mutex
	n  int
	at time.Time // zero: never read
}

// want returns how many acknowledgements a placement waits for:
// min(limit, replicas online), reading INFO replication when the cached
// count is older than replicaRefresh or fresh is set. limit <= 0 is 0
// without any read.
func (c *replicaCount) want(ctx context.Context, rdb redis.UniversalClient, limit int, fresh bool) (int, error) {
	if limit <= 0 {
		return 0, nil
	}
	c.mu.Lock()
	n, at := c.n, c.at
	c.mu.Unlock()
	if fresh || at.IsZero() || time.Since(at) > replicaRefresh {
		info, err := rdb.Info(ctx, "replication").Result()
		if err != nil {
			return 0, fmt.Errorf("read the replicas online: %w", err)
		}
		n = onlineReplicas(info)
		c.mu.Lock()
		c.n, c.at = n, time.Now()
		c.mu.Unlock()
	}
	return min(limit, n), nil
}

// onlineReplicas counts the replicas in an INFO replication reply that are
// online ("slave0:ip=…,port=…,state=online,…"); replicas still syncing
// acknowledge nothing.
func onlineReplicas(info string) int {
	n := 0
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "slave") && strings.Contains(line, ":ip=") && strings.Contains(line, ",state=online") {
			n++
		}
	}
	return n
}
