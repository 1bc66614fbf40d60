package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/gpubroker/gpubroker/broker/api/redisschema"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// The stores' deadline and the lifetime of finished records.
const (
	// DefaultOpTimeout bounds each store operation (one or a few round trips).
	DefaultOpTimeout = 2 * time.Second
	// DefaultRetention is how long a stopped or failed server record and an
	// idle event stream are kept before Redis expires them.
	DefaultRetention = 7 * 24 * time.Hour
	// eventMaxLen is the approximate number of events kept per server.
	eventMaxLen = 256
)

// Store keeps GPU inventory, placement, quota usage, server records and
// server events in Redis. It is safe for concurrent use, also by several
// processes sharing one Redis: every read-modify-write is one Lua script.
//
// The caller owns the client and closes it. Create the client with
// ContextTimeoutEnabled: true so that the per-operation timeouts and the
// caller's cancellation reach the socket; without it go-redis applies only
// its own read and write timeouts.
type Store struct {
	rdb       redis.UniversalClient
	blocking  redis.UniversalClient // Events' blocking reads; rdb unless WithBlockingClient
	k         redisschema.Keys
	now       func() time.Time
	opTimeout time.Duration // DefaultOpTimeout
	retention time.Duration // DefaultRetention
	// waitReplicas and waitTimeout: Place's WAIT (WithWaitReplicas);
	// replicas caches how many replicas are online.
	waitReplicas int
	waitTimeout  time.Duration
	replicas     *replicaCount
	// batch: WithBatch; places and releases: their group commit.
	batch    int
	places   *batcher[scriptOp, batchReply]
	releases *batcher[scriptOp, batchReply]
}

// Option configures a Store.
type Option func(*Store)

// WithClock sets the time source for record and event times and for the
// reconcile marker; default time.Now. Scripts never read Redis's clock.
func WithClock(now func() time.Time) Option { return func(s *Store) { s.now = now } }

// WithBlockingClient makes Events' blocking reads (XREAD BLOCK) use c
// instead of the store's client. A waiting read holds its connection for
// its whole block, even after the event stream's client went away, so many
// streams would otherwise take the connections that placement and every
// other operation need (creates timed out behind streams before).
// Default: the store's client.
func WithBlockingClient(c redis.UniversalClient) Option {
	return func(s *Store) {
		if c != nil {
			s.blocking = c
		}
	}
}

// WithWaitReplicas makes Place wait until min(n, the replicas online)
// Redis replicas have acknowledged the placement (WAIT, on the connection
// that ran the script, so every earlier write is covered too), at most
// timeout. A placement that fewer acknowledged in time (and fewer than are
// online after the wait) is released again and refused with an error
// wrapping fleet.ErrUnavailable. So the caller creates a pod only for a
// placement that every replica a Sentinel failover could promote holds
// (Sentinel promotes the replica with the most replicated data); with no
// replica online there is none to promote. The replicas online are read
// from INFO replication (state=online) at most once a second, and at once
// after a wait fell short. Default n = 0: no wait (a single Redis). n <= 0
// or timeout <= 0 turns the wait off.
func WithWaitReplicas(n int, timeout time.Duration) Option {
	return func(s *Store) {
		if n > 0 && timeout > 0 {
			s.waitReplicas, s.waitTimeout = n, timeout
		} else {
			s.waitReplicas, s.waitTimeout = 0, 0
		}
	}
}

// WithBatch sets how many places, and separately how many releases, one
// script carries at most (group commit, batch.go): 1 sends each alone;
// default DefaultBatch. n < 1 means 1.
func WithBatch(n int) Option { return func(s *Store) { s.batch = max(n, 1) } }

// New returns a Store on client with every key under prefix, followed by
// the hash tag {gpubroker} (redisschema.New). prefix may be ""; it must be the same for every
// broker replica sharing the fleet and must not contain '{' or '}' (they
// would change which part of a key Redis Cluster hashes). New does no I/O.
func New(client redis.UniversalClient, prefix string, opts ...Option) *Store {
	s := &Store{
		rdb:       client,
		k:         redisschema.New(prefix),
		now:       time.Now,
		opTimeout: DefaultOpTimeout,
		retention: DefaultRetention,
		replicas:  &replicaCount{},
		batch:     DefaultBatch,
	}
	for _, o := range opts {
		o(s)
	}
	s.places = &batcher[scriptOp, batchReply]{max: s.batch, inFlight: batchesInFlight, run: s.runPlaces}
	s.releases = &batcher[scriptOp, batchReply]{max: s.batch, inFlight: batchesInFlight, run: s.runReleases}
	if s.blocking == nil {
		s.blocking = client
	}
	return s
}

// op returns ctx bounded by the per-operation timeout.
func (s *Store) op(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.opTimeout)
}

// Ping checks that Redis answers, for readiness probes.
func (s *Store) Ping(ctx context.Context) error {
	ctx, cancel := s.op(ctx)
	defer cancel()
	if err := s.rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis ping: %w", err)
	}
	return nil
}

// MarkReconciled records that allocations have been rebuilt from pods, so
// placement may proceed. The marker has no TTL; it disappears only with the
// data (a flush or a restart without persistence), which is the point.
func (s *Store) MarkReconciled(ctx context.Context) error {
	ctx, cancel := s.op(ctx)
	defer cancel()
	at := s.now().UTC().Format(time.RFC3339Nano)
	if err := s.rdb.Set(ctx, s.k.Marker(), at, 0).Err(); err != nil {
		return fmt.Errorf("mark reconciled: %w", err)
	}
	return nil
}

// ReconcileEpoch returns the token of the data Redis holds now, creating
// one (fleet.NewEpoch at the store's clock, random nonce) when there is none
// (after a flush or a restart), and whether the reconcile marker is set
// (placement is open), in one round trip. A reconcile pass reads it before
// anything else and marks with MarkReconciledAt, so that a pass that began
// before Redis lost its data never marks the empty data rebuilt;
// fleet.EpochBegan reads when the data was found lost.
func (s *Store) ReconcileEpoch(ctx context.Context) (epoch string, marked bool, err error) {
	ctx, cancel := s.op(ctx)
	defer cancel()
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", false, fmt.Errorf("reconcile epoch: %w", err)
	}
	token := fleet.NewEpoch(s.now(), hex.EncodeToString(b[:]))
	var set *redis.StatusCmd
	var exists *redis.IntCmd
	_, _ = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		// SET NX GET: the stored token if there is one, else ours, stored.
		set = p.SetArgs(ctx, s.k.MarkerEpoch(), token, redis.SetArgs{Mode: "NX", Get: true})
		exists = p.Exists(ctx, s.k.Marker())
		return nil
	}) // each command's own error is read below
	cur, err := set.Result()
	switch {
	case errors.Is(err, redis.Nil):
		cur = token
	case err != nil:
		return "", false, fmt.Errorf("reconcile epoch: %w", err)
	}
	n, err := exists.Result()
	if err != nil {
		return "", false, fmt.Errorf("reconcile epoch: read the marker: %w", err)
	}
	return cur, n == 1, nil
}

// MarkReconciledAt is MarkReconciled on the condition that the reconcile
// epoch is still epoch (one atomic script); it reports whether it marked.
func (s *Store) MarkReconciledAt(ctx context.Context, epoch string) (bool, error) {
	ctx, cancel := s.op(ctx)
	defer cancel()
	at := s.now().UTC().Format(time.RFC3339Nano)
	n, err := markReconciledScript.Run(ctx, s.rdb, []string{s.k.MarkerEpoch(), s.k.Marker()}, epoch, at).Int()
	if err != nil {
		return false, fmt.Errorf("mark reconciled: %w", err)
	}
	return n == 1, nil
}

// Reconciled reports whether the reconcile marker exists.
func (s *Store) Reconciled(ctx context.Context) (bool, error) {
	ctx, cancel := s.op(ctx)
	defer cancel()
	n, err := s.rdb.Exists(ctx, s.k.Marker()).Result()
	if err != nil {
		return false, fmt.Errorf("read reconcile marker: %w", err)
	}
	return n == 1, nil
}

// notFound translates redis.Nil into fleet.ErrNotFound with context.
func notFound(err error, what string) error {
	if errors.Is(err, redis.Nil) {
		return fmt.Errorf("%w: %s", fleet.ErrNotFound, what)
	}
	return fmt.Errorf("%s: %w", what, err)
}
