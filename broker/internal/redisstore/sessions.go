package redisstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/gpubroker/gpubroker/broker/api/redisschema"
)

// Sessions keeps the web login's pending sign-ins, sessions and refresh
// locks (broker/internal/auth.SessionStore) under redisschema.Keys.Login,
// Session and SessionRefresh: keys hold the SHA-256 of the state or cookie
// value, never the value. Every record is written with a TTL. Safe for
// concurrent use, also across replicas.
type Sessions struct {
	rdb       redis.UniversalClient
	k         redisschema.Keys
	opTimeout time.Duration
}

// NewSessions returns the session store on client under prefix. It does
// no I/O.
func NewSessions(client redis.UniversalClient, prefix string) *Sessions {
	return &Sessions{rdb: client, k: redisschema.New(prefix), opTimeout: DefaultOpTimeout}
}

func (s *Sessions) op(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.opTimeout)
}

// bytesOrNone turns a GET-like reply into (value, found, error).
func bytesOrNone(b []byte, err error) ([]byte, bool, error) {
	if errors.Is(err, redis.Nil) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	return b, true, nil
}

// PutLogin stores the pending sign-in of state for ttl.
func (s *Sessions) PutLogin(ctx context.Context, state string, v []byte, ttl time.Duration) error {
	ctx, cancel := s.op(ctx)
	defer cancel()
	if err := s.rdb.Set(ctx, s.k.Login(state), v, ttl).Err(); err != nil {
		return fmt.Errorf("store sign-in: %w", err)
	}
	return nil
}

// TakeLogin reads and deletes the pending sign-in of state (GETDEL).
func (s *Sessions) TakeLogin(ctx context.Context, state string) ([]byte, bool, error) {
	ctx, cancel := s.op(ctx)
	defer cancel()
	b, ok, err := bytesOrNone(s.rdb.GetDel(ctx, s.k.Login(state)).Bytes())
	if err != nil {
		return nil, false, fmt.Errorf("take sign-in: %w", err)
	}
	return b, ok, nil
}

// Session returns session id's record.
func (s *Sessions) Session(ctx context.Context, id string) ([]byte, bool, error) {
	ctx, cancel := s.op(ctx)
	defer cancel()
	b, ok, err := bytesOrNone(s.rdb.Get(ctx, s.k.Session(id)).Bytes())
	if err != nil {
		return nil, false, fmt.Errorf("read session: %w", err)
	}
	return b, ok, nil
}

// PutSession stores session id for ttl.
func (s *Sessions) PutSession(ctx context.Context, id string, v []byte, ttl time.Duration) error {
	ctx, cancel := s.op(ctx)
	defer cancel()
	if err := s.rdb.Set(ctx, s.k.Session(id), v, ttl).Err(); err != nil {
		return fmt.Errorf("store session: %w", err)
	}
	return nil
}

// ReplaceSession rewrites session id if it still exists, keeping its TTL
// (SET XX KEEPTTL): a logout that happened meanwhile wins.
func (s *Sessions) ReplaceSession(ctx context.Context, id string, v []byte) (bool, error) {
	ctx, cancel := s.op(ctx)
	defer cancel()
	err := s.rdb.SetArgs(ctx, s.k.Session(id), v, redis.SetArgs{Mode: "XX", KeepTTL: true}).Err()
	if errors.Is(err, redis.Nil) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("replace session: %w", err)
	}
	return true, nil
}

// DeleteSession ends session id.
func (s *Sessions) DeleteSession(ctx context.Context, id string) error {
	ctx, cancel := s.op(ctx)
	defer cancel()
	if err := s.rdb.Del(ctx, s.k.Session(id)).Err(); err != nil {
		return fmt.Errorf("delete session: %w", err)
	}
	return nil
}

// LockRefresh takes session id's refresh lock with token for ttl (SET NX).
func (s *Sessions) LockRefresh(ctx context.Context, id, token string, ttl time.Duration) (bool, error) {
	ctx, cancel := s.op(ctx)
	defer cancel()
	won, err := s.rdb.SetNX(ctx, s.k.SessionRefresh(id), token, ttl).Result()
	if err != nil {
		return false, fmt.Errorf("session refresh lock: %w", err)
	}
	return won, nil
}

// UnlockRefresh releases session id's lock if token still holds it
// (scripts/release_lock.lua).
func (s *Sessions) UnlockRefresh(ctx context.Context, id, token string) error {
	ctx, cancel := s.op(ctx)
	defer cancel()
	if err := releaseLockScript.Run(ctx, s.rdb, []string{s.k.SessionRefresh(id)}, token).Err(); err != nil {
		return fmt.Errorf("release session refresh lock: %w", err)
	}
	return nil
}
