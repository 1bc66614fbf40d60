package redisstore

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/redistest"
)

func pendingServer(user, name, spawn, idem string) fleet.Server {
	return fleet.Server{
		ServerKey:      fleet.ServerKey{User: user, Name: name},
		Profile:        "small",
		SpawnID:        spawn,
		IdempotencyKey: idem,
		State:          v1.StatePending,
		Message:        "queued",
		Slice:          fleet.Slice{MemoryMiB: 8192, ComputePercent: 20, ComputeLimitPercent: 50},
	}
}

// eventView is an event without its stream id, for comparisons.
type eventView struct {
	Spawn   string
	State   fleet.State
	Message string
}

func events(t *testing.T, s *Store, k fleet.ServerKey, after string) ([]eventView, []fleet.Event) {
	t.Helper()
	evs, err := s.Events(t.Context(), k, after, 0)
	if err != nil {
		t.Fatalf("Events(%q): %v", after, err)
	}
	var out []eventView
	for _, e := range evs {
		out = append(out, eventView{e.SpawnID, e.State, e.Message})
	}
	return out, evs
}

func TestCreateServer(t *testing.T) {
	srv := redistest.Start(t)
	s, clk := newStore(t, srv)
	k := fleet.ServerKey{User: "alice", Name: "nb"}

	want := pendingServer("alice", "nb", "spawn-1", "idem-1")
	want.CreatedAt, want.UpdatedAt = clk.Now(), clk.Now()
	want.Sharing = fleet.SharingSliced // a profile without a mode is sliced
	got, created, err := s.CreateServer(t.Context(), pendingServer("alice", "nb", "spawn-1", "idem-1"))
	if err != nil || !created {
		t.Fatalf("CreateServer = %v, %v; want created", created, err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("created record (-want +got):\n%s", diff)
	}
	if stored, err := s.GetServer(t.Context(), k); err != nil || !cmp.Equal(want, stored) {
		t.Errorf("GetServer = %+v, %v; want %+v", stored, err, want)
	}

	clk.Advance(time.Second)
	t.Run("a retry with the same key returns the record", func(t *testing.T) {
		again, created, err := s.CreateServer(t.Context(), pendingServer("alice", "nb", "spawn-2", "idem-1"))
		if err != nil || created {
			t.Fatalf("CreateServer retry = %v, %v; want existing", created, err)
		}
		if diff := cmp.Diff(want, again); diff != "" {
			t.Errorf("retry record (-want +got):\n%s", diff)
		}
	})
	t.Run("another key while live is a conflict naming the state", func(t *testing.T) {
		_, _, err := s.CreateServer(t.Context(), pendingServer("alice", "nb", "spawn-2", "idem-2"))
		if !errors.Is(err, fleet.ErrConflict) {
			t.Fatalf("err = %v, want ErrConflict", err)
		}
		var se *fleet.StateError
		if !errors.As(err, &se) || se.State != v1.StatePending || se.SpawnID != "spawn-1" {
			t.Errorf("err = %#v, want a StateError naming state pending and spawn spawn-1", err)
		}
		if got, want := fleet.Message(err), `nb is already starting; wait for it, or stop it first to start it again`; got != want {
			t.Errorf("message %q, want %q", got, want)
		}
	})
	t.Run("an empty key never matches", func(t *testing.T) {
		_, _, err := s.CreateServer(t.Context(), pendingServer("alice", "nb", "spawn-2", ""))
		if !errors.Is(err, fleet.ErrConflict) {
			t.Fatalf("err = %v, want ErrConflict", err)
		}
	})
	t.Run("a non-pending record is invalid", func(t *testing.T) {
		bad := pendingServer("alice", "other", "spawn-x", "k")
		bad.State = v1.StateRunning
		if _, _, err := s.CreateServer(t.Context(), bad); !errors.Is(err, fleet.ErrInvalid) {
			t.Errorf("err = %v, want ErrInvalid", err)
		}
	})
	t.Run("after a terminal state a new key starts a new spawn", func(t *testing.T) {
		if _, err := s.Transition(t.Context(), k, "spawn-1", v1.StateFailed, "image pull failed", Patch{}); err != nil {
			t.Fatal(err)
		}
		if ttl := srv.Client(t).PTTL(t.Context(), s.k.Server("alice", "nb")).Val(); ttl <= 0 {
			t.Errorf("failed record TTL = %v, want the retention period", ttl)
		}
		// The old key still answers with the old, failed record.
		old, created, err := s.CreateServer(t.Context(), pendingServer("alice", "nb", "spawn-2", "idem-1"))
		if err != nil || created || old.SpawnID != "spawn-1" || old.State != v1.StateFailed {
			t.Errorf("retry after failure = %+v, %v, %v; want the failed spawn-1", old, created, err)
		}
		next, created, err := s.CreateServer(t.Context(), pendingServer("alice", "nb", "spawn-2", "idem-2"))
		if err != nil || !created || next.SpawnID != "spawn-2" || next.State != v1.StatePending {
			t.Fatalf("CreateServer after failure = %+v, %v, %v; want pending spawn-2", next, created, err)
		}
		if ttl := srv.Client(t).PTTL(t.Context(), s.k.Server("alice", "nb")).Val(); ttl != -1 {
			t.Errorf("live record TTL = %v, want none (-1)", ttl)
		}
		got, _ := events(t, s, k, "")
		wantEv := []eventView{
			{"spawn-1", v1.StatePending, "queued"},
			{"spawn-1", v1.StateFailed, "image pull failed"},
			{"spawn-2", v1.StatePending, "queued"},
		}
		if diff := cmp.Diff(wantEv, got); diff != "" {
			t.Errorf("events (-want +got):\n%s", diff)
		}
	})
}

// TestCreateServerRefusesANewSpawnDuringARebuild: while the reconcile
// marker is missing, a server whose record Redis lost may still run its
// pod; a new spawn recorded under its name would make the reconciler take
// that pod for a replaced spawn's and delete it (the chaos soak lost 16
// servers so). So CreateServer refuses a new spawn then and writes nothing,
// a failed record it would replace included; a retry with the key of the
// record that is there still gets that record.
func TestCreateServerRefusesANewSpawnDuringARebuild(t *testing.T) {
	srv := redistest.Start(t)
	s, _ := newStore(t, srv)
	ctx := t.Context()
	rdb := srv.Client(t)
	k := fleet.ServerKey{User: "alice", Name: "old"}
	if _, _, err := s.CreateServer(ctx, pendingServer("alice", "old", "spawn-1", "idem-1")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Transition(ctx, k, "spawn-1", v1.StateFailed, "image pull failed", Patch{}); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Del(ctx, s.k.Marker()).Err(); err != nil {
		t.Fatal(err)
	}
	before := rdb.Keys(ctx, "*").Val()
	slices.Sort(before)
	for _, tc := range []struct{ name, server, idem string }{
		{"a new server", "nb", "idem-2"},
		{"a failed server started again", "old", "idem-3"},
	} {
		_, created, err := s.CreateServer(ctx, pendingServer("alice", tc.server, "spawn-2", tc.idem))
		if !errors.Is(err, fleet.ErrNotReady) || created {
			t.Errorf("%s: CreateServer = %v, %v; want fleet.ErrNotReady", tc.name, created, err)
		}
	}
	after := rdb.Keys(ctx, "*").Val()
	slices.Sort(after)
	if !slices.Equal(before, after) {
		t.Errorf("keys before %v, after the refused creates %v; want nothing written", before, after)
	}
	if got, err := s.GetServer(ctx, k); err != nil || got.SpawnID != "spawn-1" || got.State != v1.StateFailed {
		t.Errorf("the failed record after a refused start: %+v, %v", got, err)
	}
	got, created, err := s.CreateServer(ctx, pendingServer("alice", "old", "spawn-9", "idem-1"))
	if err != nil || created || got.SpawnID != "spawn-1" {
		t.Errorf("a retry with the record's own key = %+v, %v, %v; want the failed spawn-1", got, created, err)
	}
	if err := s.MarkReconciled(ctx); err != nil {
		t.Fatal(err)
	}
	if _, created, err := s.CreateServer(ctx, pendingServer("alice", "nb", "spawn-2", "idem-2")); err != nil || !created {
		t.Errorf("CreateServer once rebuilt = %v, %v; want created", created, err)
	}
}

func TestTransitionFollowsLifecycle(t *testing.T) {
	srv := redistest.Start(t)
	s, _ := newStore(t, srv)
	all := []fleet.State{v1.StatePending, v1.StatePlacing, v1.StateCreating, v1.StateStarting,
		v1.StateRunning, v1.StateStopping, v1.StateStopped, v1.StateFailed}
	// path walks a fresh server to each state along allowed transitions.
	path := map[fleet.State][]fleet.State{
		v1.StatePending:  nil,
		v1.StatePlacing:  {v1.StatePlacing},
		v1.StateCreating: {v1.StatePlacing, v1.StateCreating},
		v1.StateStarting: {v1.StatePlacing, v1.StateCreating, v1.StateStarting},
		v1.StateRunning:  {v1.StatePlacing, v1.StateCreating, v1.StateStarting, v1.StateRunning},
		v1.StateStopping: {v1.StateStopping},
		v1.StateStopped:  {v1.StateStopping, v1.StateStopped},
		v1.StateFailed:   {v1.StateFailed},
	}
	n := 0
	for _, from := range all {
		for _, to := range all {
			if from == to {
				continue
			}
			t.Run(fmt.Sprintf("%s to %s", from, to), func(t *testing.T) {
				n++
				k := fleet.ServerKey{User: "u", Name: fmt.Sprintf("s%d", n)}
				spawn := fmt.Sprintf("spawn-%d", n)
				if _, _, err := s.CreateServer(t.Context(), pendingServer(k.User, k.Name, spawn, "")); err != nil {
					t.Fatal(err)
				}
				for _, st := range path[from] {
					if _, err := s.Transition(t.Context(), k, spawn, st, "step", Patch{}); err != nil {
						t.Fatalf("walking to %s: %v", from, err)
					}
				}
				got, err := s.Transition(t.Context(), k, spawn, to, "go", Patch{})
				allowed := slices.Contains(fleet.TransitionSources(to), from)
				switch {
				case allowed && err != nil:
					t.Fatalf("allowed transition refused: %v", err)
				case allowed && got.State != to:
					t.Fatalf("state = %s, want %s", got.State, to)
				case !allowed && to == v1.StatePending && !errors.Is(err, fleet.ErrInvalid):
					t.Fatalf("transition to pending: err = %v, want ErrInvalid", err)
				case !allowed && to != v1.StatePending && !errors.Is(err, fleet.ErrConflict):
					t.Fatalf("forbidden transition: err = %v, want ErrConflict", err)
				}
				if !allowed {
					cur, err := s.GetServer(t.Context(), k)
					if err != nil || cur.State != from {
						t.Errorf("after a refused transition state = %s, %v; want %s", cur.State, err, from)
					}
				}
			})
		}
	}
}

func TestTransitionSpawnCASAndPatches(t *testing.T) {
	srv := redistest.Start(t)
	s, clk := newStore(t, srv)
	k := fleet.ServerKey{User: "alice", Name: ""}
	if _, _, err := s.CreateServer(t.Context(), pendingServer("alice", "", "spawn-1", "i1")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Transition(t.Context(), fleet.ServerKey{User: "alice", Name: "nope"}, "spawn-1", v1.StatePlacing, "", Patch{}); !errors.Is(err, fleet.ErrNotFound) {
		t.Errorf("unknown server: err = %v, want ErrNotFound", err)
	}
	if _, err := s.Transition(t.Context(), k, "spawn-0", v1.StatePlacing, "late", Patch{}); !errors.Is(err, fleet.ErrConflict) {
		t.Errorf("old spawn: err = %v, want ErrConflict", err)
	}

	clk.Advance(time.Second)
	alloc := &fleet.Allocation{SliceID: "spawn-1", User: "alice", Groups: []string{"ml"},
		Slice: fleet.Slice{MemoryMiB: 8192, ComputePercent: 20, ComputeLimitPercent: 50}, GPUUUID: "GPU-1", Node: "n1"}
	got, err := s.Transition(t.Context(), k, "spawn-1", v1.StatePlacing, "placing", Patch{Allocation: alloc})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(alloc, got.Allocation); diff != "" {
		t.Errorf("patched allocation (-want +got):\n%s", diff)
	}
	if !got.UpdatedAt.Equal(clk.Now()) || got.CreatedAt.Equal(clk.Now()) {
		t.Errorf("times created %v updated %v; want only updated moved to %v", got.CreatedAt, got.UpdatedAt, clk.Now())
	}
	pod, url := "nb-alice", "http://10.0.0.7:8888"
	for _, st := range []fleet.State{v1.StateCreating, v1.StateStarting} {
		if _, err := s.Transition(t.Context(), k, "spawn-1", st, string(st), Patch{Pod: &pod}); err != nil {
			t.Fatal(err)
		}
	}
	got, err = s.Transition(t.Context(), k, "spawn-1", v1.StateRunning, "running", Patch{URL: &url})
	if err != nil {
		t.Fatal(err)
	}
	if got.Pod != pod || got.URL != url || got.Allocation == nil {
		t.Errorf("record %+v; want pod %s, url %s and the allocation kept", got, pod, url)
	}

	_, before := events(t, s, k, "")
	// Same state, same message: no event. Same state, new message: one event.
	if _, err := s.Transition(t.Context(), k, "spawn-1", v1.StateRunning, "running", Patch{}); err != nil {
		t.Errorf("repeated transition: %v", err)
	}
	if _, err := s.Transition(t.Context(), k, "spawn-1", v1.StateRunning, "running; idle for 1h", Patch{}); err != nil {
		t.Errorf("message update: %v", err)
	}
	after, _ := events(t, s, k, before[len(before)-1].ID)
	if diff := cmp.Diff([]eventView{{"spawn-1", v1.StateRunning, "running; idle for 1h"}}, after); diff != "" {
		t.Errorf("events after the running event (-want +got):\n%s", diff)
	}

	// A new spawn; the old spawn's late events are refused.
	if _, err := s.Transition(t.Context(), k, "spawn-1", v1.StateStopping, "stopping", Patch{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Transition(t.Context(), k, "spawn-1", v1.StateStopped, "stopped", Patch{}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.CreateServer(t.Context(), pendingServer("alice", "", "spawn-2", "i2")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Transition(t.Context(), k, "spawn-1", v1.StateStopped, "late stop", Patch{}); !errors.Is(err, fleet.ErrConflict) {
		t.Errorf("late event of the old spawn: err = %v, want ErrConflict", err)
	}
	cur, err := s.GetServer(t.Context(), k)
	if err != nil || cur.SpawnID != "spawn-2" || cur.State != v1.StatePending || cur.Allocation != nil || cur.Pod != "" {
		t.Errorf("record after a late event = %+v, %v; want a clean pending spawn-2", cur, err)
	}
}

func TestMoveFromAndSetMessageWriteOnlyFromTheirState(t *testing.T) {
	srv := redistest.Start(t)
	s, clk := newStore(t, srv)
	ctx := t.Context()
	k := fleet.ServerKey{User: "alice", Name: "nb"}
	if _, _, err := s.CreateServer(ctx, pendingServer("alice", "nb", "spawn-1", "i1")); err != nil {
		t.Fatal(err)
	}
	for _, st := range []fleet.State{v1.StatePlacing, v1.StateCreating} {
		if _, err := s.Transition(ctx, k, "spawn-1", st, string(st), Patch{}); err != nil {
			t.Fatal(err)
		}
	}
	pod, url := "nb-alice-nb", "http://10.0.0.7:8888"
	stateIs := func(err error, want fleet.State) bool {
		var se *fleet.StateError
		return errors.As(err, &se) && se.State == want && errors.Is(err, fleet.ErrConflict)
	}
	unchanged := func(what string, want fleet.Server) {
		t.Helper()
		cur, err := s.GetServer(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, cur); diff != "" {
			t.Errorf("%s changed the record (-before +after):\n%s", what, diff)
		}
	}
	creating, err := s.GetServer(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	_, before := events(t, s, k, "")

	// From the wrong state nothing is written, and the state is told.
	clk.Advance(time.Second)
	if _, err := s.SetMessage(ctx, k, "spawn-1", v1.StateStarting, "pulling the image"); !stateIs(err, v1.StateCreating) {
		t.Errorf("SetMessage on a creating record: err = %v, want a StateError naming creating", err)
	}
	if _, err := s.MoveFrom(ctx, k, "spawn-1", v1.StateStarting, v1.StateRunning, "running", Patch{URL: &url}); !stateIs(err, v1.StateCreating) {
		t.Errorf("MoveFrom starting on a creating record: err = %v, want a StateError naming creating", err)
	}
	unchanged("refused calls", creating)
	if _, err := s.MoveFrom(ctx, k, "spawn-1", v1.StatePending, v1.StateRunning, "running", Patch{}); !errors.Is(err, fleet.ErrInvalid) {
		t.Errorf("MoveFrom pending to running: err = %v, want ErrInvalid (no such step)", err)
	}
	if _, err := s.SetMessage(ctx, k, "spawn-0", v1.StateCreating, "late"); !errors.Is(err, fleet.ErrConflict) {
		t.Errorf("SetMessage of an old spawn: err = %v, want ErrConflict", err)
	}
	if _, err := s.SetMessage(ctx, fleet.ServerKey{User: "alice", Name: "none"}, "spawn-1", v1.StateStarting, "x"); !errors.Is(err, fleet.ErrNotFound) {
		t.Errorf("SetMessage of no server: err = %v, want ErrNotFound", err)
	}
	unchanged("calls for other spawns", creating)

	// In its state: the message is set once, the same message again writes nothing.
	if _, err := s.Transition(ctx, k, "spawn-1", v1.StateStarting, "pod created", Patch{Pod: &pod}); err != nil {
		t.Fatal(err)
	}
	got, err := s.SetMessage(ctx, k, "spawn-1", v1.StateStarting, "pulling the image")
	if err != nil || got.Message != "pulling the image" || got.State != v1.StateStarting {
		t.Fatalf("SetMessage on a starting record = %+v, %v", got, err)
	}
	clk.Advance(time.Second)
	if _, err := s.SetMessage(ctx, k, "spawn-1", v1.StateStarting, "pulling the image"); err != nil {
		t.Fatal(err)
	}
	unchanged("the same message again", got)

	// MoveFrom moves once with its patch; in the target state already it refuses.
	moved, err := s.MoveFrom(ctx, k, "spawn-1", v1.StateStarting, v1.StateRunning, "running at "+url, Patch{URL: &url})
	if err != nil || moved.State != v1.StateRunning || moved.URL != url || moved.Pod != pod || !moved.UpdatedAt.Equal(clk.Now()) {
		t.Fatalf("MoveFrom starting to running = %+v, %v; want running with its URL, the pod kept, updated now", moved, err)
	}
	clk.Advance(time.Second)
	other := "http://10.0.0.8:8888"
	if _, err := s.MoveFrom(ctx, k, "spawn-1", v1.StateStarting, v1.StateRunning, "running again", Patch{URL: &other}); !stateIs(err, v1.StateRunning) {
		t.Errorf("MoveFrom on a record in the target state: err = %v, want a StateError naming running", err)
	}
	unchanged("a second move", moved)
	after, _ := events(t, s, k, before[len(before)-1].ID)
	want := []eventView{{"spawn-1", v1.StateStarting, "pod created"}, {"spawn-1", v1.StateStarting, "pulling the image"},
		{"spawn-1", v1.StateRunning, "running at " + url}}
	if diff := cmp.Diff(want, after); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

func TestEventsReplayAndBlock(t *testing.T) {
	srv := redistest.Start(t)
	s, clk := newStore(t, srv)
	k := fleet.ServerKey{User: "bob@example.com", Name: "a:b"}
	if _, _, err := s.CreateServer(t.Context(), pendingServer(k.User, k.Name, "sp", "")); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Minute)
	if _, err := s.Transition(t.Context(), k, "sp", v1.StatePlacing, "placing", Patch{}); err != nil {
		t.Fatal(err)
	}
	got, all := events(t, s, k, "")
	if diff := cmp.Diff([]eventView{{"sp", v1.StatePending, "queued"}, {"sp", v1.StatePlacing, "placing"}}, got); diff != "" {
		t.Fatalf("events (-want +got):\n%s", diff)
	}
	if !all[1].Time.Equal(clk.Now()) || !all[0].Time.Equal(clk.Now().Add(-time.Minute)) {
		t.Errorf("event times %v, %v; want the clock's %v and %v", all[0].Time, all[1].Time, clk.Now().Add(-time.Minute), clk.Now())
	}
	rest, _ := events(t, s, k, all[0].ID)
	if diff := cmp.Diff([]eventView{{"sp", v1.StatePlacing, "placing"}}, rest); diff != "" {
		t.Errorf("events after the first (-want +got):\n%s", diff)
	}
	if none, _ := events(t, s, k, all[1].ID); len(none) != 0 {
		t.Errorf("events after the last = %v, want none", none)
	}
	for _, bad := range []string{"abc", "1-2-3", "-", "1-", "$"} {
		if _, err := s.Events(t.Context(), k, bad, 0); !errors.Is(err, fleet.ErrInvalid) {
			t.Errorf("Events(%q) err = %v, want ErrInvalid", bad, err)
		}
	}

	t.Run("a blocked read wakes when an event arrives", func(t *testing.T) {
		type result struct {
			evs []fleet.Event
			err error
		}
		done := make(chan result, 1)
		go func() {
			evs, err := s.Events(t.Context(), k, all[1].ID, time.Minute)
			done <- result{evs, err}
		}()
		// The reader may block before or after the transition; either way it
		// must return the new event, long before its minute passes.
		if _, err := s.Transition(t.Context(), k, "sp", v1.StateCreating, "creating pod", Patch{}); err != nil {
			t.Fatal(err)
		}
		deadline := time.NewTimer(10 * time.Second)
		defer deadline.Stop()
		select {
		case r := <-done:
			if r.err != nil || len(r.evs) != 1 || r.evs[0].State != v1.StateCreating {
				t.Errorf("blocked Events = %+v, %v; want the creating event", r.evs, r.err)
			}
		case <-deadline.C:
			t.Fatal("blocked Events did not return within 10s of the event")
		}
	})
	t.Run("a blocked read returns nothing when the block passes", func(t *testing.T) {
		_, all := events(t, s, k, "")
		evs, err := s.Events(t.Context(), k, all[len(all)-1].ID, 20*time.Millisecond)
		if err != nil || len(evs) != 0 {
			t.Errorf("Events = %v, %v; want none", evs, err)
		}
	})
	t.Run("a blocked read returns at once when events exist", func(t *testing.T) {
		evs, err := s.Events(t.Context(), k, "", time.Hour)
		if err != nil || len(evs) != 3 {
			t.Errorf("Events = %v, %v; want the 3 stored events", evs, err)
		}
	})
}

func TestListDeleteRestoreServers(t *testing.T) {
	srv := redistest.Start(t)
	s, clk := newStore(t, srv)
	for _, k := range []fleet.ServerKey{{User: "bob", Name: "z"}, {User: "alice", Name: "b"}, {User: "alice", Name: ""}, {User: "a", Name: "lice:b"}, {User: "alice:b", Name: ""}} {
		if _, _, err := s.CreateServer(t.Context(), pendingServer(k.User, k.Name, "sp-"+k.User+"-"+k.Name, "")); err != nil {
			t.Fatal(err)
		}
	}
	keysOf := func(list []fleet.Server) []fleet.ServerKey {
		var out []fleet.ServerKey
		for _, x := range list {
			out = append(out, x.ServerKey)
		}
		return out
	}
	list, err := s.ListServers(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	wantAll := []fleet.ServerKey{{User: "a", Name: "lice:b"}, {User: "alice", Name: ""}, {User: "alice", Name: "b"}, {User: "alice:b", Name: ""}, {User: "bob", Name: "z"}}
	if diff := cmp.Diff(wantAll, keysOf(list)); diff != "" {
		t.Errorf("ListServers(all) (-want +got):\n%s", diff)
	}
	list, err = s.ListServers(t.Context(), "alice")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]fleet.ServerKey{{User: "alice", Name: ""}, {User: "alice", Name: "b"}}, keysOf(list)); diff != "" {
		t.Errorf("ListServers(alice) (-want +got):\n%s", diff)
	}

	k := fleet.ServerKey{User: "alice", Name: "b"}
	spawn := "sp-alice-b"
	if err := s.DeleteServer(t.Context(), k, spawn); !errors.Is(err, fleet.ErrConflict) {
		t.Errorf("DeleteServer of a live server: err = %v, want ErrConflict", err)
	}
	if _, err := s.Transition(t.Context(), k, spawn, v1.StateFailed, "failed", Patch{}); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteServer(t.Context(), k, "other"); !errors.Is(err, fleet.ErrConflict) {
		t.Errorf("DeleteServer of another spawn: err = %v, want ErrConflict", err)
	}
	if err := s.DeleteServer(t.Context(), k, spawn); err != nil {
		t.Fatalf("DeleteServer: %v", err)
	}
	if err := s.DeleteServer(t.Context(), k, spawn); err != nil {
		t.Errorf("second DeleteServer: %v, want nil", err)
	}
	if _, err := s.GetServer(t.Context(), k); !errors.Is(err, fleet.ErrNotFound) {
		t.Errorf("GetServer after delete: err = %v, want ErrNotFound", err)
	}
	if evs, _ := events(t, s, k, ""); len(evs) != 0 {
		t.Errorf("events after delete = %v, want none", evs)
	}
	list, _ = s.ListServers(t.Context(), "alice")
	if diff := cmp.Diff([]fleet.ServerKey{{User: "alice", Name: ""}}, keysOf(list)); diff != "" {
		t.Errorf("ListServers(alice) after delete (-want +got):\n%s", diff)
	}

	t.Run("an expired record leaves the lists", func(t *testing.T) {
		rdb := srv.Client(t)
		if err := rdb.Del(t.Context(), s.k.Server("bob", "z")).Err(); err != nil { // as if its TTL passed
			t.Fatal(err)
		}
		list, err := s.ListServers(t.Context(), "")
		if err != nil || len(list) != 3 {
			t.Fatalf("ListServers = %d servers, %v; want 3", len(list), err)
		}
		if n := rdb.SCard(t.Context(), s.k.AllServers()).Val(); n != 3 {
			t.Errorf("all-servers set has %d members, want the stale one removed (3)", n)
		}
	})

	t.Run("RestoreServer writes only when absent", func(t *testing.T) {
		clk.Advance(time.Hour)
		created := clk.Now().Add(-30 * time.Minute)
		r := fleet.Server{
			ServerKey: fleet.ServerKey{User: "carol", Name: "x"}, Profile: "small", SpawnID: "sp-c",
			State: v1.StateRunning, Message: "running", Slice: fleet.Slice{MemoryMiB: 1024, ComputePercent: 10, ComputeLimitPercent: 10},
			Allocation: &fleet.Allocation{SliceID: "sp-c", User: "carol", GPUUUID: "GPU-1", Node: "n1",
				Slice: fleet.Slice{MemoryMiB: 1024, ComputePercent: 10, ComputeLimitPercent: 10}},
			Pod: "nb-carol-x", URL: "http://10.0.0.9:8888", CreatedAt: created,
		}
		ok, err := s.RestoreServer(t.Context(), r)
		if err != nil || !ok {
			t.Fatalf("RestoreServer = %v, %v; want written", ok, err)
		}
		want := r
		want.UpdatedAt, want.Sharing = clk.Now(), fleet.SharingSliced
		got, err := s.GetServer(t.Context(), r.ServerKey)
		if diff := cmp.Diff(want, got); err != nil || diff != "" {
			t.Errorf("restored record (-want +got), err %v:\n%s", err, diff)
		}
		evs, _ := events(t, s, r.ServerKey, "")
		if diff := cmp.Diff([]eventView{{"sp-c", v1.StateRunning, RestoreMessage}}, evs); diff != "" {
			t.Errorf("restore events (-want +got):\n%s", diff)
		}
		r.State = v1.StateFailed
		if ok, err := s.RestoreServer(t.Context(), r); err != nil || ok {
			t.Errorf("second RestoreServer = %v, %v; want false, nil", ok, err)
		}
		// The restored server goes on through the normal lifecycle.
		if _, err := s.Transition(t.Context(), r.ServerKey, "sp-c", v1.StateStopping, "stopping", Patch{}); err != nil {
			t.Errorf("Transition after restore: %v", err)
		}
	})
}

// TestListServersReadsManyInBatches: a listing longer than one batch
// (listBatch records a round trip) returns every record in order and drops
// expired members found in any batch.
func TestListServersReadsManyInBatches(t *testing.T) {
	srv := redistest.Start(t)
	s, _ := newStore(t, srv)
	n := 2*listBatch + 7
	for i := range n {
		if _, _, err := s.CreateServer(t.Context(), pendingServer(fmt.Sprintf("u%04d", i), "nb", fmt.Sprintf("sp-%d", i), "")); err != nil {
			t.Fatal(err)
		}
	}
	rdb := srv.Client(t)
	for _, i := range []int{3, listBatch + 1, n - 1} { // one expired record in each batch
		if err := rdb.Del(t.Context(), s.k.Server(fmt.Sprintf("u%04d", i), "nb")).Err(); err != nil {
			t.Fatal(err)
		}
	}
	list, err := s.ListServers(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != n-3 {
		t.Fatalf("ListServers = %d servers, want %d", len(list), n-3)
	}
	for i := 1; i < len(list); i++ {
		if list[i-1].User >= list[i].User {
			t.Fatalf("list out of order at %d: %s before %s", i, list[i-1].User, list[i].User)
		}
	}
	if got := rdb.SCard(t.Context(), s.k.AllServers()).Val(); got != int64(n-3) {
		t.Errorf("all-servers set has %d members, want the 3 expired ones removed (%d)", got, n-3)
	}
}

// TestListServerStatesReadsTheStateFields: ListServerStates returns the
// records ListServers does, in the same order, with the fields it
// promises equal to the whole records' (and the allocation's slice for a
// placed one, without the rest of the allocation), and drops an expired
// member as ListServers does.
func TestListServerStatesReadsTheStateFields(t *testing.T) {
	srv := redistest.Start(t)
	s, clk := newStore(t, srv)
	ctx := t.Context()
	for _, k := range []fleet.ServerKey{{User: "bob", Name: "z"}, {User: "alice", Name: "b"}, {User: "alice", Name: "gone"}} {
		if _, _, err := s.CreateServer(ctx, pendingServer(k.User, k.Name, "sp-"+k.User+"-"+k.Name, "")); err != nil {
			t.Fatal(err)
		}
	}
	clk.Advance(time.Minute)
	held := fleet.Slice{MemoryMiB: 4096, ComputePercent: 10, ComputeLimitPercent: 30}
	alloc := fleet.Allocation{SliceID: "sp-bob-z", User: "bob", GPUUUID: "GPU-1", Node: "n1", Slice: held}
	if _, err := s.Transition(ctx, fleet.ServerKey{User: "bob", Name: "z"}, "sp-bob-z", v1.StatePlacing, "placing", Patch{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Transition(ctx, fleet.ServerKey{User: "bob", Name: "z"}, "sp-bob-z", v1.StateCreating, "placed", Patch{Allocation: &alloc}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Transition(ctx, fleet.ServerKey{User: "alice", Name: "b"}, "sp-alice-b", v1.StateFailed, "refused", Patch{}); err != nil {
		t.Fatal(err)
	}
	rdb := srv.Client(t)
	if err := rdb.Del(ctx, s.k.Server("alice", "gone")).Err(); err != nil { // as if its TTL passed
		t.Fatal(err)
	}
	whole, err := s.ListServers(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.SAdd(ctx, s.k.AllServers(), s.k.Server("alice", "gone")).Err(); err != nil { // expired again for the second listing
		t.Fatal(err)
	}
	states, err := s.ListServerStates(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	var want []fleet.Server
	for _, w := range whole {
		st := fleet.Server{ServerKey: w.ServerKey, Profile: w.Profile, SpawnID: w.SpawnID, State: w.State, Slice: w.Slice,
			CreatedAt: w.CreatedAt, UpdatedAt: w.UpdatedAt}
		if w.Allocation != nil {
			st.Allocation = &fleet.Allocation{SliceID: w.SpawnID, Slice: w.Allocation.Slice}
		}
		want = append(want, st)
	}
	if diff := cmp.Diff(want, states); diff != "" {
		t.Errorf("ListServerStates (-want: ListServers' fields, +got):\n%s", diff)
	}
	if len(states) != 2 || states[1].Allocation == nil || states[1].Allocation.Slice != held {
		t.Errorf("ListServerStates = %+v, want alice/b and bob/z, bob/z holding %+v", states, held)
	}
	if n := rdb.SCard(ctx, s.k.AllServers()).Val(); n != 2 {
		t.Errorf("all-servers set has %d members, want the expired one removed (2)", n)
	}
	mine, err := s.ListServerStates(ctx, "alice")
	if err != nil || len(mine) != 1 || mine[0].Name != "b" || mine[0].State != v1.StateFailed {
		t.Errorf("ListServerStates(alice) = %+v, %v; want alice/b failed", mine, err)
	}
}
