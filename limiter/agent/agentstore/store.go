package agentstore

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/gpubroker/gpubroker/broker/api/redisschema"
)

// Defaults of the Store options.
const (
	// DefaultMaxLen is the approximate number of samples kept per slice:
	// one hour at 1 Hz. XADD trims with MAXLEN ~, so a stream may hold up to
	// one listpack node (at most 100 entries by default) more.
	DefaultMaxLen = 3600
	// DefaultSampleTTL is how long a slice's sample stream outlives its last
	// write; it collects the streams of slices that are gone.
	DefaultSampleTTL = 24 * time.Hour
	// DefaultQuotaTTL is how long desired and applied quota hashes outlive
	// their last write. The broker should delete them when it releases a
	// slice; the TTL only collects what it missed.
	DefaultQuotaTTL = 30 * 24 * time.Hour
	// DefaultOpTimeout bounds each operation.
	DefaultOpTimeout = 2 * time.Second
	// StaleAfter is the number of intervals after which a sample or node
	// report counts as stale.
	StaleAfter = 3
	// auditMaxLen is the approximate number of audit records kept.
	auditMaxLen = 10000
)

// ErrNotFound is returned (wrapped) when a record does not exist.
var ErrNotFound = errors.New("agentstore: not found")

// ErrCorrupt is returned (wrapped) when a stored record cannot be decoded.
var ErrCorrupt = errors.New("agentstore: corrupt record")

// Store reads and writes the agent contract in Redis. It is safe for
// concurrent use. The caller owns and closes the client.
type Store struct {
	rdb       redis.UniversalClient
	k         redisschema.Keys
	maxLen    int64
	sampleTTL time.Duration
	quotaTTL  time.Duration
	opTimeout time.Duration
	claimIdle time.Duration // FollowAudit: how long a record stays unacknowledged before it is handed out again

	mu         sync.Mutex
	expiresSet map[string]time.Time // slice → when its stream TTL was last refreshed (writer's clock)
}

// Option configures a Store.
type Option func(*Store)

// WithMaxLen sets the approximate number of samples kept per slice; default
// DefaultMaxLen. n <= 0 keeps the default.
func WithMaxLen(n int64) Option {
	return func(s *Store) {
		if n > 0 {
			s.maxLen = n
		}
	}
}

// WithSampleTTL sets how long a sample stream outlives its last write;
// default DefaultSampleTTL. d <= 0 keeps the default.
func WithSampleTTL(d time.Duration) Option {
	return func(s *Store) {
		if d > 0 {
			s.sampleTTL = d
		}
	}
}

// WithAuditRetry sets how long a record FollowAudit handed out may stay
// unacknowledged (its handler failed, or its consumer died) before it is
// handed out again; default 30 s. d <= 0 keeps the default.
func WithAuditRetry(d time.Duration) Option {
	return func(s *Store) {
		if d > 0 {
			s.claimIdle = d
		}
	}
}

// New returns a Store on client with keys under prefix (redisschema.New:
// may be "", must not contain '{' or '}'). It does no I/O.
func New(client redis.UniversalClient, prefix string, opts ...Option) *Store {
	s := &Store{
		rdb:        client,
		k:          redisschema.New(prefix),
		maxLen:     DefaultMaxLen,
		sampleTTL:  DefaultSampleTTL,
		quotaTTL:   DefaultQuotaTTL,
		opTimeout:  DefaultOpTimeout,
		claimIdle:  auditClaimIdle,
		expiresSet: map[string]time.Time{},
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Keys returns the store's key builder.
func (st *Store) Keys() redisschema.Keys { return st.k }

func (st *Store) op(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, st.opTimeout)
}

// needsExpire reports whether slice's stream TTL should be refreshed at now:
// once per tenth of the TTL, so a live stream never expires and the writes
// carry one PEXPIRE per slice per TTL/10 instead of one per sample.
func (st *Store) needsExpire(slice string, now time.Time) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	last, ok := st.expiresSet[slice]
	if ok && now.Sub(last) < st.sampleTTL/10 && !now.Before(last) {
		return false
	}
	st.expiresSet[slice] = now
	return true
}

// Forget drops what the store remembers about slice (its TTL refresh time);
// call it when a slice leaves the node so the memory stays bounded.
func (st *Store) Forget(slice string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	delete(st.expiresSet, slice)
}
