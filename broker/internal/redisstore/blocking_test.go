package redisstore

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/redistest"
)

// TestWaitingEventStreamsDoNotStarveOperations holds every connection of a
// one-connection pool with a waiting event stream: on the store's own
// client, the next operation cannot get a connection; with the streams on a
// client of their own (WithBlockingClient), it goes through.
func TestWaitingEventStreamsDoNotStarveOperations(t *testing.T) {
	srv := redistest.Start(t)
	one := func(t *testing.T) *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 1, PoolTimeout: 200 * time.Millisecond, ContextTimeoutEnabled: true})
		t.Cleanup(func() { c.Close() })
		return c
	}
	for _, tc := range []struct {
		name     string
		separate bool
	}{{"streams on the store's client", false}, {"streams on their own client", true}} {
		t.Run(tc.name, func(t *testing.T) {
			ops := one(t)
			var opts []Option
			if tc.separate {
				opts = append(opts, WithBlockingClient(one(t)))
			}
			s := New(ops, srv.Prefix(t), opts...)
			ctx, cancel := context.WithCancel(t.Context())
			var wg sync.WaitGroup
			wg.Go(func() { _, _ = s.Events(ctx, fleet.ServerKey{User: "u", Name: "n"}, "", 3*time.Second) })
			defer func() { cancel(); wg.Wait() }()
			// Wait until the read is blocked in Redis.
			admin := srv.Client(t)
			deadline := time.Now().Add(10 * time.Second)
			for {
				info, err := admin.Info(t.Context(), "clients").Result()
				if err == nil && strings.Contains(info, "blocked_clients:1") {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the event read never blocked: %v %q", err, info)
				}
				tick := time.NewTimer(10 * time.Millisecond)
				<-tick.C
			}
			_, err := s.GetServer(t.Context(), fleet.ServerKey{User: "u", Name: "other"})
			starved := err != nil && !strings.Contains(err.Error(), "not found")
			if starved != !tc.separate {
				t.Errorf("GetServer while a stream waits: %v (starved %v, want %v)", err, starved, !tc.separate)
			}
		})
	}
}
