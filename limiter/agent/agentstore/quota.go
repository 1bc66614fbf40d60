package agentstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

// DesiredQuota is the quota the broker wants a slice to have.
type DesiredQuota struct {
	// Generation orders desired quotas of one slice; assigned by
	// SetDesiredQuota, >= 1.
	Generation int64
	v1.Slice
}

// AppliedQuota is what the agent last wrote into a slice's quota file.
type AppliedQuota struct {
	// Generation is the desired generation that the quota file now holds.
	Generation int64
	// FileGeneration is the generation inside the quota file (the hook's
	// counter; independent of Generation).
	FileGeneration uint64
	// Node is the node of the agent that applied it.
	Node string
	// At is when the agent applied it (agent's clock).
	At time.Time
}

// SetDesiredQuota stores q as slice's desired quota with the next
// generation, in one MULTI/EXEC, and publishes the slice id on the
// QuotaChanged channel. It returns the new generation. The broker calls it
// on resize and reclaim; a broker Lua script that must change the desired
// quota atomically with an allocation can instead HSET the same fields of
// redisschema.Keys.DesiredQuota and HINCRBY "gen" itself.
func (st *Store) SetDesiredQuota(ctx context.Context, slice string, q v1.Slice) (int64, error) {
	if slice == "" {
		return 0, errors.New("set desired quota: empty slice id")
	}
	if q.MemoryMiB <= 0 || q.ComputePercent < 1 || q.ComputePercent > 100 || q.ComputeLimitPercent < q.ComputePercent || q.ComputeLimitPercent > 100 {
		return 0, fmt.Errorf("set desired quota of slice %s: invalid slice %+v", slice, q)
	}
	ctx, cancel := st.op(ctx)
	defer cancel()
	key := st.k.DesiredQuota(slice)
	var gen *redis.IntCmd
	_, err := st.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, key, "mem", q.MemoryMiB, "cp", q.ComputePercent, "cl", q.ComputeLimitPercent)
		gen = p.HIncrBy(ctx, key, "gen", 1)
		p.PExpire(ctx, key, st.quotaTTL)
		p.Publish(ctx, st.k.QuotaChanged(), slice)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("set desired quota of slice %s: %w", slice, err)
	}
	return gen.Val(), nil
}

// DesiredQuota returns slice's desired quota, or an error wrapping
// ErrNotFound when the broker set none.
func (st *Store) DesiredQuota(ctx context.Context, slice string) (DesiredQuota, error) {
	ctx, cancel := st.op(ctx)
	defer cancel()
	h, err := st.rdb.HGetAll(ctx, st.k.DesiredQuota(slice)).Result()
	if err != nil {
		return DesiredQuota{}, fmt.Errorf("desired quota of slice %s: %w", slice, err)
	}
	if len(h) == 0 {
		return DesiredQuota{}, fmt.Errorf("%w: no desired quota for slice %s", ErrNotFound, slice)
	}
	var errs []error
	num := func(f string) int64 {
		n, err := strconv.ParseInt(h[f], 10, 64)
		if err != nil {
			errs = append(errs, fmt.Errorf("field %s: %w", f, err))
		}
		return n
	}
	d := DesiredQuota{Generation: num("gen"), Slice: v1.Slice{
		MemoryMiB:           num("mem"),
		ComputePercent:      int(num("cp")),
		ComputeLimitPercent: int(num("cl")),
	}}
	if err := errors.Join(errs...); err != nil {
		return DesiredQuota{}, fmt.Errorf("%w: desired quota of slice %s: %w", ErrCorrupt, slice, err)
	}
	return d, nil
}

// SetAppliedQuota records that the agent applied a desired generation.
func (st *Store) SetAppliedQuota(ctx context.Context, slice string, a AppliedQuota) error {
	ctx, cancel := st.op(ctx)
	defer cancel()
	key := st.k.AppliedQuota(slice)
	_, err := st.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, key, "gen", a.Generation, "fgen", strconv.FormatUint(a.FileGeneration, 10),
			"node", a.Node, "at", a.At.UnixMilli())
		p.PExpire(ctx, key, st.quotaTTL)
		return nil
	})
	if err != nil {
		return fmt.Errorf("set applied quota of slice %s: %w", slice, err)
	}
	return nil
}

// AppliedQuota returns what the agent last applied for slice, or an error
// wrapping ErrNotFound.
func (st *Store) AppliedQuota(ctx context.Context, slice string) (AppliedQuota, error) {
	ctx, cancel := st.op(ctx)
	defer cancel()
	h, err := st.rdb.HGetAll(ctx, st.k.AppliedQuota(slice)).Result()
	if err != nil {
		return AppliedQuota{}, fmt.Errorf("applied quota of slice %s: %w", slice, err)
	}
	if len(h) == 0 {
		return AppliedQuota{}, fmt.Errorf("%w: no applied quota for slice %s", ErrNotFound, slice)
	}
	gen, err1 := strconv.ParseInt(h["gen"], 10, 64)
	fgen, err2 := strconv.ParseUint(h["fgen"], 10, 64)
	at, err3 := strconv.ParseInt(h["at"], 10, 64)
	if err := errors.Join(err1, err2, err3); err != nil {
		return AppliedQuota{}, fmt.Errorf("%w: applied quota of slice %s: %w", ErrCorrupt, slice, err)
	}
	return AppliedQuota{Generation: gen, FileGeneration: fgen, Node: h["node"], At: time.UnixMilli(at).UTC()}, nil
}

// DeleteQuotas removes slice's desired and applied quota; samples expire
// after SampleTTL. The broker calls it when it releases the slice.
func (st *Store) DeleteQuotas(ctx context.Context, slice string) error {
	ctx, cancel := st.op(ctx)
	defer cancel()
	if err := st.rdb.Del(ctx, st.k.DesiredQuota(slice), st.k.AppliedQuota(slice)).Err(); err != nil {
		return fmt.Errorf("delete quotas of slice %s: %w", slice, err)
	}
	return nil
}

// WatchQuotaChanges subscribes to QuotaChanged and calls fn with each slice
// id published, from this goroutine, until ctx ends; then it returns nil.
// It returns an error only when the first subscription fails; go-redis
// resubscribes by itself after later connection failures. Messages
// published while not subscribed are lost: callers pair it with a periodic
// resync.
func (st *Store) WatchQuotaChanges(ctx context.Context, fn func(slice string)) error {
	ps := st.rdb.Subscribe(ctx)
	defer ps.Close()
	sctx, cancel := st.op(ctx)
	err := ps.Subscribe(sctx, st.k.QuotaChanged())
	if err == nil {
		// Wait for the confirmation, so that a publish after return of
		// the first fn call or after PUBSUB NUMSUB > 0 is seen.
		_, err = ps.Receive(sctx)
	}
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("watch quota changes: %w", err)
	}
	// Channel runs its own reader goroutine, which Close stops; a blocked
	// Receive would not notice ctx ending.
	ch := ps.Channel()
	for {
		select {
		case <-ctx.Done():
			return nil
		case m, ok := <-ch:
			if !ok {
				return errors.New("watch quota changes: subscription closed")
			}
			fn(m.Payload)
		}
	}
}
