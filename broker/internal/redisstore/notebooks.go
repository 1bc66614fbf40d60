package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/gpubroker/gpubroker/broker/api/redisschema"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// ActivityTTL is how long a spawn's proxy activity record lives after its
// last write: longer than any idle window the reclaimer looks back over.
const ActivityTTL = 25 * time.Hour

// Notebooks keeps the notebook proxy's records (broker/internal/proxy
// Handoffs and ActivityStore): host mode's one-time codes and notebook
// host sessions (keys hold the SHA-256 of the code or cookie value, never
// the value; every record has a TTL), and the per-spawn activity each
// replica's proxy saw. Safe for concurrent use, also across replicas.
type Notebooks struct {
	rdb       redis.UniversalClient
	k         redisschema.Keys
	opTimeout time.Duration
}

// NewNotebooks returns the notebook proxy's store on client under prefix.
// It does no I/O.
func NewNotebooks(client redis.UniversalClient, prefix string) *Notebooks {
	return &Notebooks{rdb: client, k: redisschema.New(prefix), opTimeout: DefaultOpTimeout}
}

func (n *Notebooks) op(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, n.opTimeout)
}

// PutHandoff stores a hand-off code's value for ttl.
func (n *Notebooks) PutHandoff(ctx context.Context, code string, v []byte, ttl time.Duration) error {
	ctx, cancel := n.op(ctx)
	defer cancel()
	if err := n.rdb.Set(ctx, n.k.Handoff(code), v, ttl).Err(); err != nil {
		return fmt.Errorf("store hand-off code: %w", err)
	}
	return nil
}

// TakeHandoff reads and deletes a hand-off code's value (GETDEL): a code
// works once.
func (n *Notebooks) TakeHandoff(ctx context.Context, code string) ([]byte, bool, error) {
	ctx, cancel := n.op(ctx)
	defer cancel()
	b, ok, err := bytesOrNone(n.rdb.GetDel(ctx, n.k.Handoff(code)).Bytes())
	if err != nil {
		return nil, false, fmt.Errorf("take hand-off code: %w", err)
	}
	return b, ok, nil
}

// PutHostSession stores a notebook host session for ttl.
func (n *Notebooks) PutHostSession(ctx context.Context, id string, v []byte, ttl time.Duration) error {
	ctx, cancel := n.op(ctx)
	defer cancel()
	if err := n.rdb.Set(ctx, n.k.HostSession(id), v, ttl).Err(); err != nil {
		return fmt.Errorf("store notebook host session: %w", err)
	}
	return nil
}

// HostSession returns a notebook host session's value.
func (n *Notebooks) HostSession(ctx context.Context, id string) ([]byte, bool, error) {
	ctx, cancel := n.op(ctx)
	defer cancel()
	b, ok, err := bytesOrNone(n.rdb.Get(ctx, n.k.HostSession(id)).Bytes())
	if err != nil {
		return nil, false, fmt.Errorf("read notebook host session: %w", err)
	}
	return b, ok, nil
}

// WebSessionAlive reports whether the web session whose cookie value has
// the hex SHA-256 digest exists (the web login's Sessions keys).
func (n *Notebooks) WebSessionAlive(ctx context.Context, digest string) (bool, error) {
	ctx, cancel := n.op(ctx)
	defer cancel()
	c, err := n.rdb.Exists(ctx, n.k.SessionByDigest(digest)).Result()
	if err != nil {
		return false, fmt.Errorf("read web session: %w", err)
	}
	return c == 1, nil
}

// PutActivity writes replica's view of spawnID's proxy activity, stamped
// at, and renews the record's ActivityTTL.
func (n *Notebooks) PutActivity(ctx context.Context, spawnID, replica string, a fleet.ProxyActivity, at time.Time) error {
	ctx, cancel := n.op(ctx)
	defer cancel()
	key := n.k.ProxyActivity(spawnID)
	v := fmt.Sprintf("%d %d %d", a.LastRequest.UnixMilli(), a.OpenWebSockets, at.UnixMilli())
	if a.LastRequest.IsZero() {
		v = fmt.Sprintf("0 %d %d", a.OpenWebSockets, at.UnixMilli())
	}
	_, err := n.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, key, replica, v)
		p.Expire(ctx, key, ActivityTTL)
		return nil
	})
	if err != nil {
		return fmt.Errorf("write proxy activity of spawn %s: %w", spawnID, err)
	}
	return nil
}

// ProxyActivity returns what the replicas' proxies saw of each spawn, in
// order: the latest request over all replicas, and the open WebSockets of
// the replicas whose record was written within fresh before now (a replica
// that stopped writing no longer counts). ok[i] is false for a spawn
// without a record. Malformed fields are skipped.
func (n *Notebooks) ProxyActivity(ctx context.Context, spawnIDs []string, now time.Time, fresh time.Duration) ([]fleet.ProxyActivity, []bool, error) {
	ctx, cancel := n.op(ctx)
	defer cancel()
	cmds := make([]*redis.MapStringStringCmd, len(spawnIDs))
	_, err := n.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range spawnIDs {
			cmds[i] = p.HGetAll(ctx, n.k.ProxyActivity(id))
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("read proxy activity: %w", err)
	}
	out := make([]fleet.ProxyActivity, len(spawnIDs))
	ok := make([]bool, len(spawnIDs))
	for i, c := range cmds {
		for _, v := range c.Val() {
			f := strings.Fields(v)
			if len(f) != 3 {
				continue
			}
			last, err1 := strconv.ParseInt(f[0], 10, 64)
			open, err2 := strconv.Atoi(f[1])
			at, err3 := strconv.ParseInt(f[2], 10, 64)
			if err1 != nil || err2 != nil || err3 != nil {
				continue
			}
			ok[i] = true
			if t := time.UnixMilli(last).UTC(); last > 0 && t.After(out[i].LastRequest) {
				out[i].LastRequest = t
			}
			if now.Sub(time.UnixMilli(at)) <= fresh {
				out[i].OpenWebSockets += open
			}
		}
	}
	return out, ok, nil
}
