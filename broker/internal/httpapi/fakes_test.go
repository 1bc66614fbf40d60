package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/audit"
	"github.com/gpubroker/gpubroker/broker/internal/auth"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// fakeServers is a small in-memory servers service with real behaviour:
// it stores servers, appends an event on every state change, honours
// idempotency keys and blocks in Events until an event arrives. fail
// makes one operation return an error, for the error-table tests.
type fakeServers struct {
	mu      sync.Mutex
	now     func() time.Time
	servers map[fleet.ServerKey]fleet.Server
	events  map[fleet.ServerKey][]fleet.Event
	seq     int
	spawns  int
	changed chan struct{} // closed and replaced on every event
	fail    map[string]error
	// creates records the (actor, user, groups) of every Create call.
	creates []createCall
	// actors records the actor and operation of every Create, Delete and
	// Remove call, as "op kind:name".
	actors []string
	// requests records the body of every Create call.
	requests []v1.CreateServerRequest
}

type createCall struct {
	User   string
	Groups []string
}

// quota is the fake's one cap, for every user: two servers.
var fakeQuota = fleet.Quota{Servers: 2, MemoryMiB: 98304, ComputePercent: 100}

func newFakeServers(now func() time.Time) *fakeServers {
	return &fakeServers{
		now:     now,
		servers: map[fleet.ServerKey]fleet.Server{},
		events:  map[fleet.ServerKey][]fleet.Event{},
		changed: make(chan struct{}),
		fail:    map[string]error{},
	}
}

var _ Servers = (*fakeServers)(nil)

// failOn makes op ("create", "get", "list", "delete", "events") return err.
func (f *fakeServers) failOn(op string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail[op] = err
}

// setLocked moves s to state and appends the event; f.mu must be held.
func (f *fakeServers) setLocked(k fleet.ServerKey, state fleet.State, msg string) fleet.Server {
	s := f.servers[k]
	s.State, s.Message, s.UpdatedAt = state, msg, f.now()
	f.servers[k] = s
	f.seq++
	f.events[k] = append(f.events[k], fleet.Event{
		ID: fmt.Sprintf("%d-0", f.seq), SpawnID: s.SpawnID, State: state, Message: msg, Time: f.now(),
	})
	close(f.changed)
	f.changed = make(chan struct{})
	return s
}

// advance moves an existing server to state, as the lifecycle would.
func (f *fakeServers) advance(k fleet.ServerKey, state fleet.State, msg string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if s, ok := f.servers[k]; ok && state == v1.StatePlacing {
		s.Allocation = &fleet.Allocation{SliceID: s.SpawnID, User: k.User, Slice: s.Slice, GPUUUID: "GPU-1", Node: "gpu-1"}
		f.servers[k] = s
	}
	f.setLocked(k, state, msg)
}

func (f *fakeServers) Create(_ context.Context, by audit.Actor, user string, groups []string, name string, req v1.CreateServerRequest, key string) (fleet.Server, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.creates = append(f.creates, createCall{User: user, Groups: slices.Clone(groups)})
	f.actors = append(f.actors, "create "+by.Kind+":"+by.Name)
	f.requests = append(f.requests, req)
	if err := f.fail["create"]; err != nil {
		return fleet.Server{}, false, err
	}
	k := fleet.ServerKey{User: user, Name: name}
	if s, ok := f.servers[k]; ok {
		switch {
		case key != "" && s.IdempotencyKey == key:
			return s, false, nil
		case !fleet.Terminal(s.State):
			return fleet.Server{}, false, &fleet.StateError{Key: k, State: s.State, SpawnID: s.SpawnID, Want: v1.StatePending}
		}
	}
	f.spawns++
	f.servers[k] = fleet.Server{
		ServerKey: k, Profile: req.Profile, SpawnID: "spawn-" + strconv.Itoa(f.spawns), IdempotencyKey: key,
		Slice: fleet.Slice{MemoryMiB: 8192, ComputePercent: 20, ComputeLimitPercent: 50}, CreatedAt: f.now(),
	}
	return f.setLocked(k, v1.StatePending, "server requested"), true, nil
}

func (f *fakeServers) Get(_ context.Context, k fleet.ServerKey) (fleet.Server, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail["get"]; err != nil {
		return fleet.Server{}, err
	}
	s, ok := f.servers[k]
	if !ok {
		return fleet.Server{}, fmt.Errorf("server %s/%s: %w", k.User, k.Name, fleet.ErrNotFound)
	}
	if k.Name == "panic" {
		panic("fake: nil map write in the servers service")
	}
	return s, nil
}

// ListPage pages the servers in (user, name) order; the cursor is
// "c:<user>\x00<name>" of the last one returned.
func (f *fakeServers) ListPage(_ context.Context, user, cursor string, limit int) ([]fleet.Server, string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail["list"]; err != nil {
		return nil, "", err
	}
	after, ok := strings.CutPrefix(cursor, "c:")
	if cursor != "" && !ok {
		return nil, "", fmt.Errorf("%w: cursor %q is not one this list returned", fleet.ErrInvalid, cursor)
	}
	var out []fleet.Server
	for k, s := range f.servers {
		if (user == "" || k.User == user) && (cursor == "" || k.User+"\x00"+k.Name > after) {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b fleet.Server) int {
		return strings.Compare(a.User+"\x00"+a.Name, b.User+"\x00"+b.Name)
	})
	if len(out) > limit {
		last := out[limit-1]
		return out[:limit], "c:" + last.User + "\x00" + last.Name, nil
	}
	return out, "", nil
}

// Quota answers fakeQuota for the user and each group, with the user's
// live servers in use.
func (f *fakeServers) Quota(_ context.Context, user string, groups []string) ([]fleet.QuotaUse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail["quota"]; err != nil {
		return nil, err
	}
	var used fleet.Quota
	for k, s := range f.servers {
		if k.User == user && !fleet.Terminal(s.State) {
			used.Servers++
			used.MemoryMiB += s.Slice.MemoryMiB
			used.ComputePercent += s.Slice.ComputePercent
		}
	}
	out := []fleet.QuotaUse{{Scope: "user", Name: user, Limit: fakeQuota, Used: used}}
	for _, g := range groups {
		out = append(out, fleet.QuotaUse{Scope: "group", Name: g, Limit: fleet.Quota{Servers: 20}})
	}
	return out, nil
}

// Remove deletes a terminal server.
func (f *fakeServers) Remove(_ context.Context, by audit.Actor, k fleet.ServerKey) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.actors = append(f.actors, "remove "+by.Kind+":"+by.Name)
	s, ok := f.servers[k]
	switch {
	case !ok:
		return fmt.Errorf("server %s/%s: %w", k.User, k.Name, fleet.ErrNotFound)
	case !fleet.Terminal(s.State):
		return &fleet.StateError{Key: k, State: s.State, SpawnID: s.SpawnID}
	}
	delete(f.servers, k)
	delete(f.events, k)
	return nil
}

func (f *fakeServers) Delete(_ context.Context, by audit.Actor, k fleet.ServerKey) (fleet.Server, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.actors = append(f.actors, "delete "+by.Kind+":"+by.Name)
	if err := f.fail["delete"]; err != nil {
		return fleet.Server{}, err
	}
	s, ok := f.servers[k]
	switch {
	case !ok:
		return fleet.Server{}, fmt.Errorf("server %s/%s: %w", k.User, k.Name, fleet.ErrNotFound)
	case s.State == v1.StateStopping || fleet.Terminal(s.State):
		return s, nil
	}
	return f.setLocked(k, v1.StateStopping, "stopping"), nil
}

func (f *fakeServers) Events(ctx context.Context, k fleet.ServerKey, after string, block time.Duration) ([]fleet.Event, error) {
	var timeout <-chan time.Time
	if block > 0 {
		t := time.NewTimer(block)
		defer t.Stop()
		timeout = t.C
	}
	for {
		f.mu.Lock()
		if err := f.fail["events"]; err != nil {
			f.mu.Unlock()
			return nil, err
		}
		out, err := f.after(k, after)
		changed := f.changed
		f.mu.Unlock()
		if err != nil || len(out) > 0 || block <= 0 {
			return out, err
		}
		select {
		case <-changed:
		case <-timeout:
			return nil, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// after returns k's events after id; f.mu must be held.
func (f *fakeServers) after(k fleet.ServerKey, id string) ([]fleet.Event, error) {
	n := 0
	if id != "" {
		var err error
		if n, err = strconv.Atoi(strings.TrimSuffix(id, "-0")); err != nil || !strings.HasSuffix(id, "-0") {
			return nil, fmt.Errorf("%w: event id %q is malformed", fleet.ErrInvalid, id)
		}
	}
	var out []fleet.Event
	for _, ev := range f.events[k] {
		if m, _ := strconv.Atoi(strings.TrimSuffix(ev.ID, "-0")); m > n {
			out = append(out, ev)
		}
	}
	return out, nil
}

// fakeProfiles filters a fixed catalog with fleet.Profile.Allows.
type fakeProfiles []fleet.Profile

func (p fakeProfiles) For(groups []string) []fleet.Profile {
	var out []fleet.Profile
	for _, pr := range p {
		if pr.Allows(groups) {
			out = append(out, pr)
		}
	}
	return out
}

// fakeFleet is an in-memory GPU inventory.
type fakeFleet struct {
	mu     sync.Mutex
	gpus   map[string]fleet.GPU
	allocs []fleet.Allocation
	err    error
}

func (f *fakeFleet) GPUs(context.Context) ([]fleet.GPU, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	var out []fleet.GPU
	for _, g := range f.gpus {
		out = append(out, g)
	}
	return out, nil
}

func (f *fakeFleet) Allocations(context.Context) ([]fleet.Allocation, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.allocs), f.err
}

func (f *fakeFleet) RegisterGPU(_ context.Context, g fleet.GPU) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err
	}
	f.gpus[g.UUID] = g
	return nil
}

func (f *fakeFleet) SetGPUMode(_ context.Context, uuid string, mode fleet.SharingMode) (fleet.GPU, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	g, ok := f.gpus[uuid]
	switch {
	case f.err != nil:
		return fleet.GPU{}, f.err
	case !ok:
		return fleet.GPU{}, fmt.Errorf("%w: gpu %s is not registered", fleet.ErrNotFound, uuid)
	case mode != "" && mode != fleet.SharingSliced && mode != fleet.SharingExclusive && mode != fleet.SharingMPS:
		return fleet.GPU{}, fmt.Errorf("%w: sharing mode must be sliced, exclusive or mps, got %q", fleet.ErrInvalid, mode)
	}
	for _, a := range f.allocs {
		if a.GPUUUID == uuid {
			return fleet.GPU{}, fmt.Errorf("%w: gpu %s holds servers", fleet.ErrConflict, uuid)
		}
	}
	g.Mode = fleet.ModeOf(mode)
	f.gpus[uuid] = g
	return g, nil
}

// fakeAuth maps fixed bearer strings to principals or errors.
type fakeAuth map[string]any // token → auth.Principal or error

func (f fakeAuth) Authenticate(_ context.Context, r *http.Request) (auth.Principal, error) {
	h := r.Header.Get("Authorization")
	if h == "" {
		return auth.Principal{}, auth.ErrNoCredentials
	}
	switch v := f[strings.TrimPrefix(h, "Bearer ")].(type) {
	case auth.Principal:
		return v, nil
	case error:
		return auth.Principal{}, v
	default:
		return auth.Principal{}, &auth.Error{Reason: "token signature is invalid"}
	}
}

// fakeChecker is a readiness check with a fixed answer; block makes it
// wait for its context instead.
type fakeChecker struct {
	name  string
	err   error
	block bool
}

func (c fakeChecker) Name() string { return c.name }
func (c fakeChecker) Check(ctx context.Context) error {
	if c.block {
		<-ctx.Done()
		return fmt.Errorf("%s: %w", c.name, ctx.Err())
	}
	return c.err
}

var errBoom = errors.New("redis: connection refused to 10.0.0.7:6379")

// fakeGuarantees answers fixed figures, or err.
type fakeGuarantees struct {
	gpus    map[string]v1.Guarantee
	servers map[string]v1.Guarantee // spawn id → figures
	err     error
}

func (f fakeGuarantees) GPUGuarantees(context.Context) (map[string]v1.Guarantee, error) {
	if f.err != nil {
		return nil, f.err
	}
	return f.gpus, nil
}

func (f fakeGuarantees) ServerGuarantee(_ context.Context, spawnID string) (*v1.Guarantee, error) {
	if f.err != nil {
		return nil, f.err
	}
	if g, ok := f.servers[spawnID]; ok {
		return &g, nil
	}
	return nil, nil
}
