package redisstore

import (
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/gpubroker/gpubroker/broker/redistest"
)

// TestRefreshLockIsReleasedOnlyByItsHolder runs on a real redis-server and
// on miniredis (dev mode's embedded Redis): a second replica cannot take a
// held lock, a wrong token does not release it, the holder's does.
func TestRefreshLockIsReleasedOnlyByItsHolder(t *testing.T) {
	mr := miniredis.RunT(t)
	dev := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = dev.Close() })
	srv := redistest.Start(t)
	for name, s := range map[string]*Sessions{"redis-server": NewSessions(srv.Client(t), srv.Prefix(t)), "miniredis": NewSessions(dev, "dev:")} {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			step := func(what string, got, want bool, err error) {
				t.Helper()
				if err != nil || got != want {
					t.Fatalf("%s: %v %v, want %v", what, got, err, want)
				}
			}
			won, err := s.LockRefresh(ctx, "sess", "a", time.Minute)
			step("first lock", won, true, err)
			won, err = s.LockRefresh(ctx, "sess", "b", time.Minute)
			step("second lock while held", won, false, err)
			step("release with another token", false, false, s.UnlockRefresh(ctx, "sess", "b"))
			won, err = s.LockRefresh(ctx, "sess", "b", time.Minute)
			step("lock after a foreign release", won, false, err)
			step("release by the holder", false, false, s.UnlockRefresh(ctx, "sess", "a"))
			won, err = s.LockRefresh(ctx, "sess", "b", time.Minute)
			step("lock after the holder's release", won, true, err)
		})
	}
}
