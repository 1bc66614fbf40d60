package redisstore

// Reading many server records: a user's or every user's, whole records or
// only their state fields, all at once or a page at a time.

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// listBatch is the most records ListServers reads in one pipeline: each
// batch is one round trip under its own operation deadline, so listing a
// fleet of thousands costs a few bounded round trips instead of one that
// grows with the fleet until it misses the deadline (the scale rig: 4,000
// records in one pipeline took over the 2 s deadline on a loaded machine).
const listBatch = 256

// ListServers returns the servers of user, or of every user when user is
// "", sorted by user then name. Set members whose record has expired are
// dropped from the sets on the way. The records are read listBatch at a
// time, each batch under its own operation deadline.
func (s *Store) ListServers(ctx context.Context, user string) ([]fleet.Server, error) {
	return s.listServers(ctx, user, func(ctx context.Context, p redis.Pipeliner, key string) recordAnswer {
		c := p.HGetAll(ctx, key)
		return func() (fleet.Server, bool, error) {
			h := c.Val()
			if len(h) == 0 {
				return fleet.Server{}, false, nil
			}
			srv, err := decodeServer(h)
			return srv, true, err
		}
	})
}

// recordStateFields are the record fields ListServerStates reads, in the order
// decodeServerState takes them.
var recordStateFields = []string{"user", "name", "profile", "spawn", "state", "slice", "alloc", "created", "updated"}

// ListServerStates is ListServers (same order, batches and dropping of
// expired members) for the passes that read the whole fleet, the
// reconciler and the fleet series: of each record it reads only the fields
// they use (HMGET of user, name, profile, spawn, state, slice, alloc,
// created and updated, not the whole hash) and returns records with only
// ServerKey, Profile, SpawnID, State, Slice, CreatedAt and UpdatedAt set,
// and, for a record that holds an allocation, Allocation with only
// SliceID and Slice set (a placed record's Slice is its allocation's,
// fleet.Server.Slice). The allocation's JSON is not decoded.
func (s *Store) ListServerStates(ctx context.Context, user string) ([]fleet.Server, error) {
	return s.listServers(ctx, user, func(ctx context.Context, p redis.Pipeliner, key string) recordAnswer {
		c := p.HMGet(ctx, key, recordStateFields...)
		return func() (fleet.Server, bool, error) {
			return decodeServerState(c.Val())
		}
	})
}

// decodeServerState reads the HMGET answer of recordStateFields; false when the
// record is gone (no user field).
func decodeServerState(v []any) (fleet.Server, bool, error) {
	if len(v) != len(recordStateFields) || v[0] == nil {
		return fleet.Server{}, false, nil
	}
	f := make([]string, len(v))
	for i, x := range v {
		f[i], _ = x.(string) // a missing field reads as ""
	}
	srv := fleet.Server{ServerKey: fleet.ServerKey{User: f[0], Name: f[1]}, Profile: f[2], SpawnID: f[3], State: fleet.State(f[4])}
	var errs []error
	if err := json.Unmarshal([]byte(f[5]), &srv.Slice); err != nil {
		errs = append(errs, fmt.Errorf("field slice: %w", err))
	}
	if f[6] != "" {
		srv.Allocation = &fleet.Allocation{SliceID: srv.SpawnID, Slice: srv.Slice}
	}
	var err error
	srv.CreatedAt, err = parseUnixNano("created", f[7])
	errs = append(errs, err)
	srv.UpdatedAt, err = parseUnixNano("updated", f[8])
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return fleet.Server{}, false, fmt.Errorf("decode server %s/%s: %w", f[0], f[1], err)
	}
	return srv, true, nil
}

// recordAnswer decodes the answer of one queued record read, once its
// pipeline has run: the record, or false when it has expired.
type recordAnswer func() (fleet.Server, bool, error)

// listServers lists user's servers (every user's for "") as ListServers
// says, reading each record with read, which queues the read of the record
// at key on a pipeline.
func (s *Store) listServers(ctx context.Context, user string, read func(ctx context.Context, p redis.Pipeliner, key string) recordAnswer) ([]fleet.Server, error) {
	var setKey string
	var members, recordKeys []string
	var err error
	octx, cancel := s.op(ctx)
	if user == "" {
		setKey = s.k.AllServers()
		members, err = s.rdb.SMembers(octx, setKey).Result()
		recordKeys = members
	} else {
		setKey = s.k.UserServers(user)
		members, err = s.rdb.SMembers(octx, setKey).Result()
		for _, name := range members {
			recordKeys = append(recordKeys, s.k.Server(user, name))
		}
	}
	cancel()
	if err != nil {
		return nil, fmt.Errorf("list servers: %w", err)
	}
	out := make([]fleet.Server, 0, len(recordKeys))
	var gone []any
	for lo := 0; lo < len(recordKeys); lo += listBatch {
		hi := min(lo+listBatch, len(recordKeys))
		answers := make([]recordAnswer, hi-lo)
		octx, cancel := s.op(ctx)
		_, err := s.rdb.Pipelined(octx, func(p redis.Pipeliner) error {
			for i, k := range recordKeys[lo:hi] {
				answers[i] = read(octx, p, k)
			}
			return nil
		})
		cancel()
		if err != nil {
			return nil, fmt.Errorf("list servers: %w", err)
		}
		for i, answer := range answers {
			srv, ok, err := answer()
			if err != nil {
				return nil, err
			}
			if !ok {
				gone = append(gone, members[lo+i])
				continue
			}
			out = append(out, srv)
		}
	}
	if len(gone) > 0 {
		// Garbage collection only; a failure leaves members for next time.
		octx, cancel := s.op(ctx)
		_ = s.rdb.SRem(octx, setKey, gone...).Err()
		cancel()
	}
	slices.SortFunc(out, func(a, b fleet.Server) int {
		return cmp.Or(cmp.Compare(a.User, b.User), cmp.Compare(a.Name, b.Name))
	})
	return out, nil
}

// ServersPage returns up to limit servers (1..1000) of user, or of every
// user when user is "", after the position after ("" = from the start),
// ordered by user, then name (byte order of the raw names), and the
// position of the next page ("" on the last). Positions are opaque
// strings (URL-safe base64 of the last user and name); one that is not a
// position this method returned wraps fleet.ErrInvalid. Records that
// expired meanwhile are skipped.
func (s *Store) ServersPage(ctx context.Context, user, after string, limit int) ([]fleet.Server, string, error) {
	if limit < 1 || limit > 1000 {
		return nil, "", fmt.Errorf("%w: page size %d is not 1..1000", fleet.ErrInvalid, limit)
	}
	var from fleet.ServerKey
	if after != "" {
		b, err := base64.RawURLEncoding.DecodeString(after)
		u, n, ok := strings.Cut(string(b), "\x00")
		if err != nil || !ok || u == "" {
			return nil, "", fmt.Errorf("%w: the cursor %q is not one this list returned", fleet.ErrInvalid, after)
		}
		from = fleet.ServerKey{User: u, Name: n}
	}
	ctx, cancel := s.op(ctx)
	defer cancel()
	var keys []fleet.ServerKey
	if user == "" {
		members, err := s.rdb.SMembers(ctx, s.k.AllServers()).Result()
		if err != nil {
			return nil, "", fmt.Errorf("list servers: %w", err)
		}
		// Each member is prefix + "srv:" + escaped user + ":" + escaped name.
		keyPrefix := strings.TrimSuffix(s.k.Server("", ""), ":")
		for _, m := range members {
			id, ok := strings.CutPrefix(m, keyPrefix)
			eu, en, ok2 := strings.Cut(id, ":")
			u, err1 := url.QueryUnescape(eu)
			n, err2 := url.QueryUnescape(en)
			if ok && ok2 && err1 == nil && err2 == nil {
				keys = append(keys, fleet.ServerKey{User: u, Name: n})
			}
		}
	} else {
		names, err := s.rdb.SMembers(ctx, s.k.UserServers(user)).Result()
		if err != nil {
			return nil, "", fmt.Errorf("list servers of %s: %w", user, err)
		}
		for _, n := range names {
			keys = append(keys, fleet.ServerKey{User: user, Name: n})
		}
	}
	order := func(a, b fleet.ServerKey) int {
		return cmp.Or(cmp.Compare(a.User, b.User), cmp.Compare(a.Name, b.Name))
	}
	if after != "" {
		keys = slices.DeleteFunc(keys, func(k fleet.ServerKey) bool { return order(k, from) <= 0 })
	}
	slices.SortFunc(keys, order)
	out := make([]fleet.Server, 0, min(limit, len(keys)))
	for len(keys) > 0 && len(out) < limit {
		batch := keys[:min(len(keys), limit-len(out))]
		keys = keys[len(batch):]
		cmds := make([]*redis.MapStringStringCmd, len(batch))
		if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, k := range batch {
				cmds[i] = p.HGetAll(ctx, s.k.Server(k.User, k.Name))
			}
			return nil
		}); err != nil {
			return nil, "", fmt.Errorf("list servers: %w", err)
		}
		for i, c := range cmds {
			if len(c.Val()) == 0 {
				continue // expired since the set was read
			}
			srv, err := decodeServer(c.Val())
			if err != nil {
				return nil, "", err
			}
			out = append(out, srv)
			if len(out) == limit && (i < len(cmds)-1 || len(keys) > 0) {
				last := batch[i]
				return out, base64.RawURLEncoding.EncodeToString([]byte(last.User + "\x00" + last.Name)), nil
			}
		}
	}
	return out, "", nil
}
