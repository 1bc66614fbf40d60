package redisstore

import (
	"context"
	"fmt"
	"sync"
)

// DefaultBatch is how many places (and, separately, releases) one script
// carries at most (WithBatch).
const DefaultBatch = 16

// batchesInFlight is how many batch scripts of one kind a Store has in
// flight at most: enough that one slow batch (a WAIT for a lagging
// replica) does not hold up every other caller, few enough that under
// load calls wait and group.
const batchesInFlight = 4

// batcher is group commit for one script: a call that arrives while fewer
// than inFlight batches are in flight goes out at once, alone; calls that
// arrive while all are in flight wait and go out together in the next, up
// to max per script.
// Nothing waits on a timer, so a lone caller pays no latency for it, and
// under load each EVALSHA's fixed cost (the round trip, the script's
// set-up, Redis's per-command bookkeeping) is shared by up to max
// operations. Each operation still runs atomically in the script, in
// arrival order; the batch as a whole is atomic too.
//
// run gets the requests of one batch and must return one result per
// request, in order, or an error for the whole batch. It runs on a context
// of its own (no caller's cancellation cuts a batch that carries other
// callers' requests); it bounds it itself.
type batcher[Req, Res any] struct {
	max      int // operations per batch, ≥ 1
	inFlight int // batches in flight at most, ≥ 1
	run      func(ctx context.Context, reqs []Req) ([]Res, error)

	mu      sync.Mutex
	queue   []*batchCall[Req, Res]
	running int // drain goroutines
}

// batchCall is one caller's request and, once done is closed, its result.
type batchCall[Req, Res any] struct {
	req  Req
	ctx  context.Context
	done chan struct{}
	res  Res
	err  error
}

// do runs req in the next batch and returns its result. If ctx ends while
// req still waits for a batch, it is taken out and never sent (ctx's
// error); if ctx ends after its batch went out, do returns ctx's error at
// once and the operation may still take effect, as a cancelled single
// command may.
func (b *batcher[Req, Res]) do(ctx context.Context, req Req) (Res, error) {
	c := &batchCall[Req, Res]{req: req, ctx: ctx, done: make(chan struct{})}
	b.mu.Lock()
	b.queue = append(b.queue, c)
	if b.running < max(b.inFlight, 1) {
		b.running++
		go b.drain()
	}
	b.mu.Unlock()
	select {
	case <-c.done:
		return c.res, c.err
	case <-ctx.Done():
		b.mu.Lock()
		for i, q := range b.queue {
			if q == c {
				b.queue = append(b.queue[:i:i], b.queue[i+1:]...)
				break
			}
		}
		b.mu.Unlock()
		var zero Res
		return zero, ctx.Err()
	}
}

// drain sends batches until no call waits.
func (b *batcher[Req, Res]) drain() {
	for {
		b.mu.Lock()
		n := min(len(b.queue), max(b.max, 1))
		if n == 0 {
			b.running--
			b.mu.Unlock()
			return
		}
		calls := b.queue[:n:n]
		b.queue = append([]*batchCall[Req, Res](nil), b.queue[n:]...)
		b.mu.Unlock()

		live := calls[:0:0]
		for _, c := range calls {
			if c.ctx.Err() != nil {
				c.err = c.ctx.Err()
				close(c.done)
				continue
			}
			live = append(live, c)
		}
		if len(live) == 0 {
			continue
		}
		reqs := make([]Req, len(live))
		for i, c := range live {
			reqs[i] = c.req
		}
		res, err := b.run(context.Background(), reqs)
		if err == nil && len(res) != len(reqs) {
			err = fmt.Errorf("a batch of %d got %d results", len(reqs), len(res))
		}
		for i, c := range live {
			if err != nil {
				c.err = err
			} else {
				c.res = res[i]
			}
			close(c.done)
		}
	}
}
