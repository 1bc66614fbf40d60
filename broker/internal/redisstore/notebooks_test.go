package redisstore

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/redistest"
)

// TestNotebooksStore runs the notebook proxy's records on a real
// redis-server and on miniredis: a hand-off code works once, host
// sessions are kept, a host session sees its web session end, and the
// replicas' activity is summed, with a silent replica's WebSockets left
// out.
func TestNotebooksStore(t *testing.T) {
	mr := miniredis.RunT(t)
	dev := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = dev.Close() })
	srv := redistest.Start(t)
	real, prefix := srv.Client(t), srv.Prefix(t)
	type pair struct {
		n *Notebooks
		s *Sessions
	}
	for name, st := range map[string]pair{
		"redis-server": {NewNotebooks(real, prefix), NewSessions(real, prefix)},
		"miniredis":    {NewNotebooks(dev, "dev:"), NewSessions(dev, "dev:")},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			n := st.n
			if err := n.PutHandoff(ctx, "code1", []byte("v1"), time.Minute); err != nil {
				t.Fatal(err)
			}
			if v, ok, err := n.TakeHandoff(ctx, "code1"); err != nil || !ok || string(v) != "v1" {
				t.Fatalf("first take: %q %t %v", v, ok, err)
			}
			if _, ok, err := n.TakeHandoff(ctx, "code1"); err != nil || ok {
				t.Fatalf("second take: %t %v, want none", ok, err)
			}
			if err := n.PutHostSession(ctx, "hid", []byte("hs"), time.Minute); err != nil {
				t.Fatal(err)
			}
			if v, ok, err := n.HostSession(ctx, "hid"); err != nil || !ok || string(v) != "hs" {
				t.Fatalf("host session: %q %t %v", v, ok, err)
			}
			sum := sha256.Sum256([]byte("web-cookie"))
			digest := hex.EncodeToString(sum[:])
			if alive, err := n.WebSessionAlive(ctx, digest); err != nil || alive {
				t.Fatalf("before sign-in: %t %v", alive, err)
			}
			if err := st.s.PutSession(ctx, "web-cookie", []byte("{}"), time.Minute); err != nil {
				t.Fatal(err)
			}
			if alive, err := n.WebSessionAlive(ctx, digest); err != nil || !alive {
				t.Fatalf("signed in: %t %v", alive, err)
			}
			if err := st.s.DeleteSession(ctx, "web-cookie"); err != nil {
				t.Fatal(err)
			}
			if alive, err := n.WebSessionAlive(ctx, digest); err != nil || alive {
				t.Fatalf("signed out: %t %v", alive, err)
			}

			now := time.UnixMilli(time.Now().UnixMilli()).UTC()
			early, late := now.Add(-10*time.Minute), now.Add(-time.Minute)
			for _, w := range []struct {
				replica string
				a       fleet.ProxyActivity
				at      time.Time
			}{
				{"r1", fleet.ProxyActivity{LastRequest: late, OpenWebSockets: 2}, now},
				{"r2", fleet.ProxyActivity{LastRequest: early, OpenWebSockets: 1}, now.Add(-5 * time.Second)},
				{"dead", fleet.ProxyActivity{LastRequest: early, OpenWebSockets: 7}, now.Add(-time.Hour)},
			} {
				if err := n.PutActivity(ctx, "sp1", w.replica, w.a, w.at); err != nil {
					t.Fatal(err)
				}
			}
			got, ok, err := n.ProxyActivity(ctx, []string{"sp1", "none"}, now, 30*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			want := []fleet.ProxyActivity{{LastRequest: late, OpenWebSockets: 3}, {}}
			if diff := cmp.Diff(want, got); diff != "" || !ok[0] || ok[1] {
				t.Errorf("activity (-want +got):\n%s ok %v", diff, ok)
			}
		})
	}
}
