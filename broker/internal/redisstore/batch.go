package redisstore

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/redis/go-redis/v9"
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

// scriptOp is one operation of a batch script (batch.lua): its own KEYS
// and ARGV, or an operation's shared ones (runBatch).
type scriptOp struct {
	keys []string
	args []any
}

// batchReply is what a batch script answered for one operation: its
// reply, or err when its body raised an error; acked and want are the
// batch's WAIT (Place: how many replicas acknowledged, of how many asked).
type batchReply struct {
	reply       any
	err         error
	acked, want int
}

// runBatch sends ops as one batch script (batch.lua: n, shared keys,
// keys per op, shared arguments, each op's argument count, then the
// arguments) and splits its reply. shared is the operation's keys and
// arguments that are the same for every op (each op's KEYS and ARGV are
// shared's followed by its own): sent once, so Redis makes their strings
// once per batch. A lone op goes as the operation's own script (one, the
// same function without the batch's tables and pcall, about a tenth
// cheaper in Redis), whose error is that op's.
func (s *Store) runBatch(ctx context.Context, one, batch *redis.Script, want int, shared scriptOp, ops []scriptOp) ([]batchReply, error) {
	if len(ops) == 1 {
		keys := append(slices.Clip(shared.keys), ops[0].keys...)
		args := append(slices.Clip(shared.args), ops[0].args...)
		res, acked, err := s.runAcked(ctx, one, want, keys, args...)
		if err != nil {
			return nil, err
		}
		return []batchReply{{reply: res, acked: acked, want: want}}, nil
	}
	kc := len(ops[0].keys)
	keys := make([]string, 0, len(shared.keys)+kc*len(ops))
	keys = append(keys, shared.keys...)
	args := make([]any, 0, 4+len(shared.args)+len(ops)*(1+len(ops[0].args)))
	args = append(args, len(ops), len(shared.keys), kc, len(shared.args))
	for _, op := range ops {
		if len(op.keys) != kc {
			return nil, fmt.Errorf("a batch mixes operations of %d and %d keys", kc, len(op.keys))
		}
		keys = append(keys, op.keys...)
		args = append(args, len(op.args))
	}
	args = append(args, shared.args...)
	for _, op := range ops {
		args = append(args, op.args...)
	}
	res, acked, err := s.runAcked(ctx, batch, want, keys, args...)
	if err != nil {
		return nil, err
	}
	list, err := asList(res)
	if err != nil {
		return nil, err
	}
	if len(list) != len(ops) {
		return nil, fmt.Errorf("a batch of %d got %d replies", len(ops), len(list))
	}
	out := make([]batchReply, len(list))
	for i, r := range list {
		out[i] = batchReply{reply: r, acked: acked, want: want}
		if l, ok := r.([]any); ok && len(l) == 2 && l[0] == "error" {
			out[i] = batchReply{err: fmt.Errorf("script error: %v", l[1])}
		}
	}
	return out, nil
}

// runAcked runs script and, when want > 0, WAIT want on the same
// connection (one pipeline, so the wait covers the script's writes and
// every earlier one), returning the script's reply and how many replicas
// acknowledged it. A script the server has not cached (a new master after
// a failover) is loaded and the pipeline sent once more.
func (s *Store) runAcked(ctx context.Context, script *redis.Script, want int, keys []string, args ...any) (any, int, error) {
	if want <= 0 {
		res, err := script.Run(ctx, s.rdb, keys, args...).Result()
		return res, 0, err
	}
	for attempt := 0; ; attempt++ {
		var ev, wait *redis.Cmd
		_, _ = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			ev = script.EvalSha(ctx, p, keys, args...)
			wait = p.Do(ctx, "wait", want, s.waitTimeout.Milliseconds())
			return nil
		}) // each command's own error is read below
		res, err := ev.Result()
		if err != nil && attempt == 0 && redis.HasErrorPrefix(err, "NOSCRIPT") {
			if err := script.Load(ctx, s.rdb).Err(); err != nil {
				return nil, 0, fmt.Errorf("load script: %w", err)
			}
			continue
		}
		if err != nil {
			return nil, 0, err
		}
		n, err := wait.Int64()
		if err != nil {
			return res, 0, fmt.Errorf("wait for %d replica(s): %w", want, err)
		}
		return res, int(n), nil
	}
}
