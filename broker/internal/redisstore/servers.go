package redisstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// Patch sets fields of a server record in the same step as a transition.
// A nil field is left as it is. It is the domain's fleet.ServerPatch.
type Patch = fleet.ServerPatch

// patchFields returns the record fields p sets, as field/value pairs.
func patchFields(p Patch) ([]any, error) {
	var out []any
	if p.DropAllocation {
		out = append(out, "alloc", "")
	} else if p.Allocation != nil {
		b, err := json.Marshal(p.Allocation)
		if err != nil {
			return nil, fmt.Errorf("encode allocation: %w", err)
		}
		out = append(out, "alloc", string(b))
		sl, err := json.Marshal(p.Allocation.Slice)
		if err != nil {
			return nil, fmt.Errorf("encode slice: %w", err)
		}
		out = append(out, "slice", string(sl))
	}
	if p.Pod != nil {
		out = append(out, "pod", *p.Pod)
	}
	if p.URL != nil {
		out = append(out, "url", *p.URL)
	}
	if p.ForgetIdempotencyKey {
		out = append(out, "idem", "", "reqsum", "")
	}
	return out, nil
}

// serverFields returns the hash fields of s (see scripts/servers.lua).
func serverFields(s fleet.Server) ([]any, error) {
	slice, err := json.Marshal(s.Slice)
	if err != nil {
		return nil, fmt.Errorf("encode slice: %w", err)
	}
	alloc := ""
	if s.Allocation != nil {
		b, err := json.Marshal(s.Allocation)
		if err != nil {
			return nil, fmt.Errorf("encode allocation: %w", err)
		}
		alloc = string(b)
	}
	return []any{
		"user", s.User, "name", s.Name, "profile", s.Profile,
		"spawn", s.SpawnID, "idem", s.IdempotencyKey, "reqsum", s.RequestDigest,
		"state", string(s.State), "msg", s.Message,
		"slice", string(slice), "alloc", alloc,
		"pod", s.Pod, "url", s.URL,
		"created", unixNano(s.CreatedAt), "updated", unixNano(s.UpdatedAt),
		"sharing", string(fleet.ModeOf(s.Sharing)), "migp", s.MIGProfile,
	}, nil
}

func unixNano(t time.Time) string { return strconv.FormatInt(t.UnixNano(), 10) }

func parseUnixNano(field, s string) (time.Time, error) {
	n, err := atoi64(field, s)
	if err != nil {
		return time.Time{}, err
	}
	return time.Unix(0, n).UTC(), nil
}

// decodeServer reads a server hash.
func decodeServer(h map[string]string) (fleet.Server, error) {
	s := fleet.Server{
		ServerKey:      fleet.ServerKey{User: h["user"], Name: h["name"]},
		Profile:        h["profile"],
		SpawnID:        h["spawn"],
		IdempotencyKey: h["idem"],
		RequestDigest:  h["reqsum"],
		State:          fleet.State(h["state"]),
		Message:        h["msg"],
		Pod:            h["pod"],
		URL:            h["url"],
		Sharing:        fleet.ModeOf(fleet.SharingMode(h["sharing"])),
		MIGProfile:     h["migp"],
	}
	var errs []error
	if err := json.Unmarshal([]byte(h["slice"]), &s.Slice); err != nil {
		errs = append(errs, fmt.Errorf("field slice: %w", err))
	}
	if raw := h["alloc"]; raw != "" {
		var a fleet.Allocation
		if err := json.Unmarshal([]byte(raw), &a); err != nil {
			errs = append(errs, fmt.Errorf("field alloc: %w", err))
		} else {
			s.Allocation = &a
		}
	}
	var err error
	s.CreatedAt, err = parseUnixNano("created", h["created"])
	errs = append(errs, err)
	s.UpdatedAt, err = parseUnixNano("updated", h["updated"])
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return fleet.Server{}, fmt.Errorf("decode server %s/%s: %w", h["user"], h["name"], err)
	}
	return s, nil
}

// serverKeys returns KEYS[1..4] of the create, restore and delete scripts.
func (s *Store) serverKeys(k fleet.ServerKey) []string {
	return []string{s.k.Server(k.User, k.Name), s.k.Events(k.User, k.Name), s.k.UserServers(k.User), s.k.AllServers()}
}

// previousTTL is how long a start keeps the record it replaced (the
// discard script's window): longer than any create's steps.
const previousTTL = 10 * time.Minute

// recordTTL is the record TTL argument for a server in state st: the
// retention for terminal states, "0" (none) otherwise.
func (s *Store) recordTTL(st fleet.State) int64 {
	if fleet.Terminal(st) {
		return s.retention.Milliseconds()
	}
	return 0
}

// CreateServer stores a new spawn of server s.ServerKey, whose State must be
// pending, and appends its "pending" event; CreatedAt and UpdatedAt are set
// from the store's clock and an empty Sharing becomes sliced. It returns
// (the stored record, true).
//
// If the record holds the same non-empty IdempotencyKey, it returns that
// record and false (a retried create). If it holds a live spawn (not
// stopped or failed) under another key, the error is a *ConflictError
// (fleet.ErrConflict) with the current state. A stopped or failed record
// it replaces is kept for a while, so that DiscardServer can put it back
// when the new start is refused. A bad s wraps fleet.ErrInvalid. While the
// reconcile marker is missing (Redis lost its data and the rebuild has not
// restored the servers of the pods that still run), a new spawn is refused
// with an error wrapping fleet.ErrNotReady: a server whose record was lost
// may still run its pod, and a new spawn of its name would make that pod
// look like a replaced spawn's, which the reconciler deletes.
func (s *Store) CreateServer(ctx context.Context, srv fleet.Server) (fleet.Server, bool, error) {
	var errs []error
	if srv.User == "" {
		errs = append(errs, errors.New("user is empty"))
	}
	if srv.SpawnID == "" {
		errs = append(errs, errors.New("spawn id is empty"))
	}
	if srv.State != v1.StatePending {
		errs = append(errs, fmt.Errorf("a new server must be pending, not %q", srv.State))
	}
	if err := errors.Join(errs...); err != nil {
		return fleet.Server{}, false, fmt.Errorf("%w: create server %s/%s: %w", fleet.ErrInvalid, srv.User, srv.Name, err)
	}
	now := s.now()
	srv.CreatedAt, srv.UpdatedAt = now, now
	srv.Sharing = fleet.ModeOf(srv.Sharing)
	fields, err := serverFields(srv)
	if err != nil {
		return fleet.Server{}, false, fmt.Errorf("create server %s/%s: %w", srv.User, srv.Name, err)
	}
	args := append([]any{srv.IdempotencyKey, unixNano(now), eventMaxLen, s.retention.Milliseconds(),
		srv.Name, srv.SpawnID, srv.Message, previousTTL.Milliseconds()}, fields...)

	ctx, cancel := s.op(ctx)
	defer cancel()
	keys := append(s.serverKeys(srv.ServerKey), s.k.ServerPrevious(srv.User, srv.Name), s.k.Marker())
	res, err := createServerScript.Run(ctx, s.rdb, keys, args...).Result()
	if err != nil {
		return fleet.Server{}, false, fmt.Errorf("create server %s/%s: %w", srv.User, srv.Name, err)
	}
	tag, rest, err := tagged(res)
	if err != nil {
		return fleet.Server{}, false, fmt.Errorf("create server %s/%s: %w", srv.User, srv.Name, err)
	}
	switch tag {
	case "created", "exists":
		if len(rest) < 1 {
			return fleet.Server{}, false, fmt.Errorf("create server %s/%s: short script reply", srv.User, srv.Name)
		}
		h, err := flatMap(rest[0])
		if err != nil {
			return fleet.Server{}, false, fmt.Errorf("create server %s/%s: %w", srv.User, srv.Name, err)
		}
		out, err := decodeServer(h)
		return out, tag == "created" && err == nil, err
	case "notready":
		return fleet.Server{}, false, fmt.Errorf("%w: create server %s/%s: GPU allocations are being rebuilt from the cluster after Redis lost its data; try again in a moment", fleet.ErrNotReady, srv.User, srv.Name)
	case "conflict":
		f, err := stringsN(rest, 2)
		if err != nil {
			return fleet.Server{}, false, fmt.Errorf("create server %s/%s: %w", srv.User, srv.Name, err)
		}
		return fleet.Server{}, false, &fleet.StateError{Key: srv.ServerKey, State: fleet.State(f[0]), SpawnID: f[1], Want: v1.StatePending}
	default:
		return fleet.Server{}, false, fmt.Errorf("create server %s/%s: unexpected script reply %q", srv.User, srv.Name, tag)
	}
}

// GetServer returns the record of k, or an error wrapping fleet.ErrNotFound.
func (s *Store) GetServer(ctx context.Context, k fleet.ServerKey) (fleet.Server, error) {
	ctx, cancel := s.op(ctx)
	defer cancel()
	h, err := s.rdb.HGetAll(ctx, s.k.Server(k.User, k.Name)).Result()
	if err != nil {
		return fleet.Server{}, fmt.Errorf("get server %s/%s: %w", k.User, k.Name, err)
	}
	if len(h) == 0 {
		return fleet.Server{}, fmt.Errorf("%w: user %s has no server %q", fleet.ErrNotFound, k.User, k.Name)
	}
	return decodeServer(h)
}

// Transition moves server k's spawn spawnID to state to with message,
// applying patch, and appends the event, in one atomic step; UpdatedAt and
// the event time come from the store's clock. It returns the new record.
//
// It refuses, with an error wrapping fleet.ErrConflict, when spawnID is not
// the record's current spawn (a late event of an old spawn never changes
// state) or when the current state is not one of fleet.TransitionSources(to).
// A transition to the state the record is already in is a success without a
// new event, unless the message differs (then the message is updated and an
// event appended); the patch is applied either way. An unknown server wraps
// fleet.ErrNotFound. Terminal states start the record's retention TTL.
func (s *Store) Transition(ctx context.Context, k fleet.ServerKey, spawnID string, to fleet.State, message string, patch Patch) (fleet.Server, error) {
	out, _, err := s.Advance(ctx, k, spawnID, to, message, patch)
	return out, err
}

// Advance is Transition that also reports whether this call moved the
// state: false when the record was in state to already (the message and
// patch applied, as Transition does), for instance moved there by another
// replica acting on the same observation. Exactly one of several racing
// calls for the same step reports true.
func (s *Store) Advance(ctx context.Context, k fleet.ServerKey, spawnID string, to fleet.State, message string, patch Patch) (fleet.Server, bool, error) {
	sources := fleet.TransitionSources(to)
	if len(sources) == 0 {
		return fleet.Server{}, false, fmt.Errorf("%w: transition server %s/%s to %q: no state leads there", fleet.ErrInvalid, k.User, k.Name, to)
	}
	return s.transition(ctx, k, spawnID, sources, true, to, message, patch)
}

// MoveFrom is Transition from state from only: it moves server k's spawn
// spawnID from from to to, applying patch and appending the event, and
// returns the new record. A record in any other state, to included, is
// left as it is, with a *fleet.StateError (wrapping fleet.ErrConflict);
// another spawn's record wraps fleet.ErrConflict, none fleet.ErrNotFound.
// A step the state machine does not allow (from is not one of
// fleet.TransitionSources(to)) wraps fleet.ErrInvalid.
func (s *Store) MoveFrom(ctx context.Context, k fleet.ServerKey, spawnID string, from, to fleet.State, message string, patch Patch) (fleet.Server, error) {
	if !slices.Contains(fleet.TransitionSources(to), from) {
		return fleet.Server{}, fmt.Errorf("%w: transition server %s/%s from %q to %q: the lifecycle has no such step", fleet.ErrInvalid, k.User, k.Name, from, to)
	}
	out, _, err := s.transition(ctx, k, spawnID, []fleet.State{from}, false, to, message, patch)
	return out, err
}

// SetMessage sets the message of server k's spawn spawnID while it is in
// state: a new message is written with its event, the same one writes
// nothing. It returns the record. A record in another state is left as it
// is, with a *fleet.StateError (wrapping fleet.ErrConflict); another
// spawn's record wraps fleet.ErrConflict, none fleet.ErrNotFound.
func (s *Store) SetMessage(ctx context.Context, k fleet.ServerKey, spawnID string, state fleet.State, message string) (fleet.Server, error) {
	out, _, err := s.transition(ctx, k, spawnID, nil, true, state, message, Patch{})
	return out, err
}

// transition runs the transition script: server k's spawn spawnID moves to
// to from one of sources, or, when stay is set and it is in to already,
// takes message and patch there (Advance's "moved" is false then).
func (s *Store) transition(ctx context.Context, k fleet.ServerKey, spawnID string, sources []fleet.State, stay bool, to fleet.State, message string, patch Patch) (fleet.Server, bool, error) {
	pf, err := patchFields(patch)
	if err != nil {
		return fleet.Server{}, false, fmt.Errorf("transition server %s/%s: %w", k.User, k.Name, err)
	}
	mode := "move"
	if stay {
		mode = "stay"
	}
	args := []any{spawnID, string(to), message, unixNano(s.now()), eventMaxLen, s.retention.Milliseconds(),
		s.recordTTL(to), mode, len(pf) / 2}
	args = append(args, pf...)
	for _, st := range sources {
		args = append(args, string(st))
	}

	ctx, cancel := s.op(ctx)
	defer cancel()
	res, err := transitionScript.Run(ctx, s.rdb, []string{s.k.Server(k.User, k.Name), s.k.Events(k.User, k.Name)}, args...).Result()
	if err != nil {
		return fleet.Server{}, false, fmt.Errorf("transition server %s/%s: %w", k.User, k.Name, err)
	}
	tag, rest, err := tagged(res)
	if err != nil {
		return fleet.Server{}, false, fmt.Errorf("transition server %s/%s: %w", k.User, k.Name, err)
	}
	switch tag {
	case "moved", "updated":
		if len(rest) < 1 {
			return fleet.Server{}, false, fmt.Errorf("transition server %s/%s: short script reply", k.User, k.Name)
		}
		h, err := flatMap(rest[0])
		if err != nil {
			return fleet.Server{}, false, fmt.Errorf("transition server %s/%s: %w", k.User, k.Name, err)
		}
		rec, err := decodeServer(h)
		return rec, err == nil && tag == "moved", err
	case "notfound":
		return fleet.Server{}, false, fmt.Errorf("%w: user %s has no server %q", fleet.ErrNotFound, k.User, k.Name)
	case "spawn":
		f, err := stringsN(rest, 1)
		if err != nil {
			return fleet.Server{}, false, fmt.Errorf("transition server %s/%s: %w", k.User, k.Name, err)
		}
		return fleet.Server{}, false, fmt.Errorf("%w: server %q of %s: spawn %s is no longer current (current spawn %s)", fleet.ErrConflict, k.Name, k.User, spawnID, f[0])
	case "state":
		f, err := stringsN(rest, 1)
		if err != nil {
			return fleet.Server{}, false, fmt.Errorf("transition server %s/%s: %w", k.User, k.Name, err)
		}
		return fleet.Server{}, false, &fleet.StateError{Key: k, State: fleet.State(f[0]), Want: to}
	default:
		return fleet.Server{}, false, fmt.Errorf("transition server %s/%s: unexpected script reply %q", k.User, k.Name, tag)
	}
}

// DeleteServer removes server k's record and events if the record's spawn
// is spawnID and it is stopped or failed; a missing record is success.
// Otherwise the error wraps fleet.ErrConflict. (Terminal records that are
// not deleted expire after the retention period.)
func (s *Store) DeleteServer(ctx context.Context, k fleet.ServerKey, spawnID string) error {
	ctx, cancel := s.op(ctx)
	defer cancel()
	res, err := deleteServerScript.Run(ctx, s.rdb, s.serverKeys(k), spawnID, k.Name).Result()
	if err != nil {
		return fmt.Errorf("delete server %s/%s: %w", k.User, k.Name, err)
	}
	tag, rest, err := tagged(res)
	if err != nil {
		return fmt.Errorf("delete server %s/%s: %w", k.User, k.Name, err)
	}
	switch tag {
	case "deleted", "absent":
		return nil
	case "spawn", "live":
		f, err := stringsN(rest, 1)
		if err != nil {
			return fmt.Errorf("delete server %s/%s: %w", k.User, k.Name, err)
		}
		if tag == "spawn" {
			return fmt.Errorf("%w: server %q of %s: spawn %s is not current (current spawn %s)", fleet.ErrConflict, k.Name, k.User, spawnID, f[0])
		}
		return &fleet.StateError{Key: k, State: fleet.State(f[0]), Want: ""}
	default:
		return fmt.Errorf("delete server %s/%s: unexpected script reply %q", k.User, k.Name, tag)
	}
}

// DiscardServer undoes a start of k that was refused before it held a
// slice or a pod: if the record is spawnID's and still pending, placing or
// creating, the record and its events go, and the stopped or failed
// record that the start replaced (CreateServer) comes back, so a refused
// start leaves nothing behind. It reports whether a record was removed; a
// missing record is no error. A record of another spawn, or one that got
// further, is left alone with an error wrapping fleet.ErrConflict.
func (s *Store) DiscardServer(ctx context.Context, k fleet.ServerKey, spawnID string) (bool, error) {
	ctx, cancel := s.op(ctx)
	defer cancel()
	keys := append(s.serverKeys(k), s.k.ServerPrevious(k.User, k.Name))
	res, err := discardServerScript.Run(ctx, s.rdb, keys, spawnID, k.Name, s.retention.Milliseconds()).Result()
	if err != nil {
		return false, fmt.Errorf("discard server %s/%s: %w", k.User, k.Name, err)
	}
	tag, rest, err := tagged(res)
	if err != nil {
		return false, fmt.Errorf("discard server %s/%s: %w", k.User, k.Name, err)
	}
	switch tag {
	case "restored", "deleted":
		return true, nil
	case "absent":
		return false, nil
	case "spawn", "live":
		f, err := stringsN(rest, 1)
		if err != nil {
			return false, fmt.Errorf("discard server %s/%s: %w", k.User, k.Name, err)
		}
		return false, fmt.Errorf("%w: discard server %q of %s: spawn %s is not discardable (%s %s)", fleet.ErrConflict, k.Name, k.User, spawnID, tag, f[0])
	default:
		return false, fmt.Errorf("discard server %s/%s: unexpected script reply %q", k.User, k.Name, tag)
	}
}

// RestoreMessage is the message of the event RestoreServer appends.
const RestoreMessage = "restored from pod"

// RestoreServer writes srv as it was rebuilt from its pod, only if no
// record of srv.ServerKey exists, with an event carrying RestoreMessage. It
// reports whether it wrote. Times are kept as given; zero times are set from
// the store's clock. A bad srv wraps fleet.ErrInvalid.
func (s *Store) RestoreServer(ctx context.Context, srv fleet.Server) (bool, error) {
	if srv.User == "" || srv.SpawnID == "" || srv.State == "" {
		return false, fmt.Errorf("%w: restore server %s/%s: user, spawn id and state are required", fleet.ErrInvalid, srv.User, srv.Name)
	}
	now := s.now()
	if srv.CreatedAt.IsZero() {
		srv.CreatedAt = now
	}
	if srv.UpdatedAt.IsZero() {
		srv.UpdatedAt = now
	}
	fields, err := serverFields(srv)
	if err != nil {
		return false, fmt.Errorf("restore server %s/%s: %w", srv.User, srv.Name, err)
	}
	args := append([]any{unixNano(now), eventMaxLen, s.retention.Milliseconds(), srv.Name, srv.SpawnID,
		string(srv.State), RestoreMessage, s.recordTTL(srv.State)}, fields...)

	ctx, cancel := s.op(ctx)
	defer cancel()
	res, err := restoreServerScript.Run(ctx, s.rdb, s.serverKeys(srv.ServerKey), args...).Result()
	if err != nil {
		return false, fmt.Errorf("restore server %s/%s: %w", srv.User, srv.Name, err)
	}
	n, err := asInt(res)
	if err != nil {
		return false, fmt.Errorf("restore server %s/%s: %w", srv.User, srv.Name, err)
	}
	return n == 1, nil
}

// streamID matches a Redis stream entry id: "<ms>" or "<ms>-<seq>".
var streamID = regexp.MustCompile(`^[0-9]{1,20}(-[0-9]{1,20})?$`)

// Events returns server k's events with ids strictly after afterID ("" =
// from the oldest retained event), oldest first. When there are none and
// block > 0 it waits up to block for the next ones and returns them, or no
// events (and no error) when block passes. A malformed afterID wraps
// fleet.ErrInvalid. Event.ID is the stream id, usable as SSE Last-Event-ID.
// A blocked call holds one pooled connection of the blocking client
// (WithBlockingClient) for its duration.
func (s *Store) Events(ctx context.Context, k fleet.ServerKey, afterID string, block time.Duration) ([]fleet.Event, error) {
	if afterID != "" && !streamID.MatchString(afterID) {
		return nil, fmt.Errorf("%w: event id %q: want <milliseconds>-<sequence>", fleet.ErrInvalid, afterID)
	}
	key := s.k.Events(k.User, k.Name)
	var msgs []redis.XMessage
	if block <= 0 {
		ctx, cancel := s.op(ctx)
		defer cancel()
		start := "-"
		if afterID != "" {
			start = "(" + afterID
		}
		var err error
		msgs, err = s.rdb.XRange(ctx, key, start, "+").Result()
		if err != nil {
			return nil, fmt.Errorf("read events of %s/%s: %w", k.User, k.Name, err)
		}
	} else {
		ctx, cancel := context.WithTimeout(ctx, block+s.opTimeout)
		defer cancel()
		from := afterID
		if from == "" {
			from = "0-0"
		}
		streams, err := s.blocking.XRead(ctx, &redis.XReadArgs{Streams: []string{key, from}, Block: max(block, time.Millisecond)}).Result()
		if errors.Is(err, redis.Nil) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("wait for events of %s/%s: %w", k.User, k.Name, err)
		}
		for _, st := range streams {
			msgs = append(msgs, st.Messages...)
		}
	}
	out := make([]fleet.Event, 0, len(msgs))
	for _, m := range msgs {
		e, err := decodeEvent(m)
		if err != nil {
			return nil, fmt.Errorf("events of %s/%s: %w", k.User, k.Name, err)
		}
		out = append(out, e)
	}
	return out, nil
}

func decodeEvent(m redis.XMessage) (fleet.Event, error) {
	str := func(f string) string {
		v, _ := m.Values[f].(string) // a missing or non-string field reads as ""
		return v
	}
	t, err := parseUnixNano("time", str("time"))
	if err != nil {
		return fleet.Event{}, fmt.Errorf("event %s: %w", m.ID, err)
	}
	return fleet.Event{ID: m.ID, SpawnID: str("spawn"), State: fleet.State(str("state")), Message: str("msg"), Time: t}, nil
}

// QuotaUsed returns what user and each of groups hold now: servers, slice
// memory (MiB) and guaranteed compute (percent), from the counters that
// placement, resize and release charge in their scripts. A group nobody
// holds anything in reads as zero.
func (s *Store) QuotaUsed(ctx context.Context, user string, groups []string) (fleet.Quota, map[string]fleet.Quota, error) {
	fields := []string{userUsage(user)}
	for _, g := range groups {
		fields = append(fields, groupUsage(g))
	}
	ctx, cancel := s.op(ctx)
	defer cancel()
	vals, err := s.rdb.HMGet(ctx, s.k.Usage(), fields...).Result()
	if err != nil {
		return fleet.Quota{}, nil, fmt.Errorf("read quota usage of %s: %w", user, err)
	}
	quotas := make([]fleet.Quota, len(fields))
	for i, v := range vals {
		str, present := v.(string) // absent fields are nil: zero
		if !present {
			continue
		}
		u, ok := parseUsage(str)
		if !ok {
			return fleet.Quota{}, nil, fmt.Errorf("read quota usage of %s: usage field %q is %q, want %s", user, fields[i], str, usageWant)
		}
		quotas[i] = fleet.Quota{Servers: int(u.servers), MemoryMiB: u.memMiB, ComputePercent: int(u.computePercent)}
	}
	byGroup := make(map[string]fleet.Quota, len(groups))
	for i, g := range groups {
		byGroup[g] = quotas[i+1]
	}
	return quotas[0], byGroup, nil
}
