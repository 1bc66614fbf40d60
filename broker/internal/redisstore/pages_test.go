package redisstore

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/redistest"
)

// TestServersPage: pages of one user's and of every server, in user and
// name order, never repeat or skip; a foreign cursor is refused.
func TestServersPage(t *testing.T) {
	srv := redistest.Start(t)
	s, _ := newStore(t, srv)
	ctx := t.Context()
	for i, k := range []fleet.ServerKey{{User: "bob", Name: "z"}, {User: "alice", Name: "b"}, {User: "alice", Name: "a c"},
		{User: "carol", Name: "x:y"}, {User: "alice", Name: "ü"}} {
		if _, _, err := s.CreateServer(ctx, pendingServer(k.User, k.Name, "sp"+string(rune('1'+i)), "k")); err != nil {
			t.Fatal(err)
		}
	}
	walk := func(user string, limit int) []string {
		t.Helper()
		var out []string
		cursor := ""
		for range 20 {
			page, next, err := s.ServersPage(ctx, user, cursor, limit)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range page {
				out = append(out, p.User+"/"+p.Name)
			}
			if next == "" {
				return out
			}
			cursor = next
		}
		t.Fatal("the pages do not end")
		return nil
	}
	all := []string{"alice/a c", "alice/b", "alice/ü", "bob/z", "carol/x:y"}
	for _, limit := range []int{1, 2, 5, 1000} {
		if diff := cmp.Diff(all, walk("", limit)); diff != "" {
			t.Errorf("every server, pages of %d (-want +got):\n%s", limit, diff)
		}
		if diff := cmp.Diff(all[:3], walk("alice", limit)); diff != "" {
			t.Errorf("alice's, pages of %d (-want +got):\n%s", limit, diff)
		}
	}
	if _, _, err := s.ServersPage(ctx, "", "not-a-cursor!", 5); !errors.Is(err, fleet.ErrInvalid) {
		t.Errorf("a foreign cursor: %v, want ErrInvalid", err)
	}
}

// TestQuotaUsed reads back what placement charged.
func TestQuotaUsed(t *testing.T) {
	srv := redistest.Start(t)
	s, _ := newStore(t, srv)
	ctx := t.Context()
	register(t, s, h200("GPU-1", "n1"))
	for _, id := range []string{"s1", "s2"} {
		if _, err := s.Place(ctx, fleet.PlaceRequest{SliceID: id, User: "ada", Slice: slice(8192, 20), GroupQuotas: map[string]fleet.Quota{"ml": {}}}); err != nil {
			t.Fatal(err)
		}
	}
	user, groups, err := s.QuotaUsed(ctx, "ada", []string{"ml", "ops"})
	if err != nil {
		t.Fatal(err)
	}
	want := fleet.Quota{Servers: 2, MemoryMiB: 16384, ComputePercent: 40}
	if diff := cmp.Diff([]any{want, map[string]fleet.Quota{"ml": want, "ops": {}}}, []any{user, groups}); diff != "" {
		t.Errorf("use (-want +got):\n%s", diff)
	}
}

// TestOutageHook: with Redis gone, every operation fails with an outage
// naming Redis (for the HTTP layer's 503), never a bare network error;
// redis.Nil and script refusals stay what they are.
func TestOutageHook(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	c.AddHook(OutageHook{})
	s := New(c, srv.Prefix(t))
	ctx := t.Context()
	if err := c.Get(ctx, "nothing").Err(); !errors.Is(err, redis.Nil) {
		t.Errorf("GET of a missing key: %v, want redis.Nil", err)
	}
	if _, err := s.Place(ctx, fleet.PlaceRequest{SliceID: "x", User: "u", Slice: slice(1, 1)}); !errors.Is(err, fleet.ErrNotReady) {
		t.Errorf("place before reconcile: %v, want ErrNotReady", err)
	}
	srv.Stop()
	checks := map[string]error{}
	_, checks["get server"] = s.GetServer(ctx, fleet.ServerKey{User: "u", Name: "n"})
	_, _, checks["create server (a script)"] = s.CreateServer(ctx, pendingServer("u", "n", "sp", "k"))
	_, _, checks["list (a pipeline)"] = s.ServersPage(ctx, "u", "", 10)
	_, checks["events"] = s.Events(ctx, fleet.ServerKey{User: "u", Name: "n"}, "", 0)
	for what, err := range checks {
		var ue *fleet.UnavailableError
		if !errors.As(err, &ue) || ue.Part != fleet.PartRedis || !errors.Is(err, fleet.ErrUnavailable) {
			t.Errorf("%s with Redis down: %v, want an outage of Redis", what, err)
		}
	}
	_ = v1.StatePending
}
