package redisstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/gpubroker/gpubroker/broker/api/redisschema"
	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/audit"
	"github.com/gpubroker/gpubroker/broker/internal/reclaim"
)

// Reclaim keeps the reclaim policy with its history and the reclaimer's
// idle states in Redis: the stores that broker/internal/reclaim declares
// (PolicyStore, IdleStates). Keys: redisschema.Keys.ReclaimPolicy,
// ReclaimPolicyVersion, ReclaimPolicyHistory, IdleState, and Audit for the
// entry of each policy save. Safe for concurrent use, also across
// replicas: a save is one script, an extension another.
//
// The policy is stored as its document, v1.ReclaimPolicy's JSON (the
// API's body): the policy has one schema end to end.
type Reclaim struct {
	rdb       redis.UniversalClient
	k         redisschema.Keys
	opTimeout time.Duration
}

var (
	_ reclaim.PolicyStore = (*Reclaim)(nil)
	_ reclaim.IdleStates  = (*Reclaim)(nil)
)

// Bounds of the reclaim keys.
const (
	// policyHistoryKeep is how many policy versions the history keeps, for
	// conflict explanations.
	policyHistoryKeep = 100
	// IdleStateTTL collects the idle states of spawns that ended; a
	// running spawn's state is rewritten at least daily (reclaim's cycle).
	IdleStateTTL = 8 * 24 * time.Hour
	// reclaimOpTimeout bounds one operation (a batch of up to 1000 states).
	reclaimOpTimeout = 5 * time.Second
	// stateBatch is how many idle states one pipeline reads or writes.
	stateBatch = 1000
)

// NewReclaim returns the reclaim store on client under prefix (the same
// prefix as the Store's). It does no I/O.
func NewReclaim(client redis.UniversalClient, prefix string) *Reclaim {
	return &Reclaim{rdb: client, k: redisschema.New(prefix), opTimeout: reclaimOpTimeout}
}

func (r *Reclaim) op(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, r.opTimeout)
}

func decodePolicy(b []byte) (reclaim.Policy, error) {
	var d v1.ReclaimPolicy
	if err := json.Unmarshal(b, &d); err != nil {
		return reclaim.Policy{}, fmt.Errorf("decode stored reclaim policy: %w", err)
	}
	return reclaim.PolicyFromAPI(d), nil
}

// Policy returns the current policy; ok is false when none was saved.
func (r *Reclaim) Policy(ctx context.Context) (reclaim.Policy, bool, error) {
	ctx, cancel := r.op(ctx)
	defer cancel()
	b, err := r.rdb.Get(ctx, r.k.ReclaimPolicy()).Bytes()
	if errors.Is(err, redis.Nil) {
		return reclaim.Policy{}, false, nil
	}
	if err != nil {
		return reclaim.Policy{}, false, fmt.Errorf("get reclaim policy: %w", err)
	}
	p, err := decodePolicy(b)
	return p, err == nil, err
}

// SavePolicy saves p as version p.Version if the current one is
// p.Version-1, with entry in the audit log, in one script
// (scripts/save_policy.lua).
func (r *Reclaim) SavePolicy(ctx context.Context, p reclaim.Policy, entry audit.Entry) (bool, error) {
	doc, err := json.Marshal(p.API())
	if err != nil {
		return false, fmt.Errorf("encode reclaim policy: %w", err)
	}
	e, err := json.Marshal(entry)
	if err != nil {
		return false, fmt.Errorf("encode audit entry: %w", err)
	}
	ctx, cancel := r.op(ctx)
	defer cancel()
	res, err := savePolicyScript.Run(ctx, r.rdb,
		[]string{r.k.ReclaimPolicy(), r.k.ReclaimPolicyVersion(), r.k.ReclaimPolicyHistory(), r.k.Audit()},
		p.Version-1, doc, e, policyHistoryKeep, auditMaxLen).Int64Slice()
	if err != nil {
		return false, fmt.Errorf("save reclaim policy: %w", err)
	}
	if len(res) != 2 {
		return false, fmt.Errorf("save reclaim policy: script returned %d values, want 2", len(res))
	}
	return res[0] == 1, nil
}

// PolicyHistory returns the kept versions by number; a version that does
// not decode is left out.
func (r *Reclaim) PolicyHistory(ctx context.Context) (map[int64]reclaim.Policy, error) {
	ctx, cancel := r.op(ctx)
	defer cancel()
	h, err := r.rdb.HGetAll(ctx, r.k.ReclaimPolicyHistory()).Result()
	if err != nil {
		return nil, fmt.Errorf("reclaim policy history: %w", err)
	}
	out := make(map[int64]reclaim.Policy, len(h))
	for v, b := range h {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			continue
		}
		if p, err := decodePolicy([]byte(b)); err == nil {
			out[n] = p
		}
	}
	return out, nil
}

// Idle state fields. The cycle writes stateFields; the extension fields
// ("ext", "extuntil") are written only by scripts/extend_idle.lua.
func msText(t time.Time) string {
	if t.IsZero() {
		return "0"
	}
	return strconv.FormatInt(t.UnixMilli(), 10)
}

func fromMs(s string) time.Time {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n == 0 {
		return time.Time{}
	}
	return time.UnixMilli(n).UTC()
}

func stateFields(st reclaim.IdleState) []any {
	exempt := "0"
	if st.Exempt {
		exempt = "1"
	}
	return []any{
		"v", string(st.Verdict), "why", st.Reason, "since", msText(st.Since), "first", msText(st.FirstSeen),
		"checked", msText(st.CheckedAt), "ex", exempt, "rung", st.Rung, "warned", msText(st.WarnedAt),
		"agewarned", msText(st.AgeWarnedAt), "shrunk", st.ShrunkFrom, "shrunklim", st.ShrunkLimitFrom,
		"stopped", msText(st.StoppedAt),
	}
}

func decodeState(spawnID string, h map[string]string) reclaim.IdleState {
	atoi := func(s string) int { n, _ := strconv.Atoi(s); return n }
	ext, _ := strconv.ParseInt(h["ext"], 10, 64)
	return reclaim.IdleState{
		SpawnID: spawnID, Verdict: reclaim.Verdict(h["v"]), Reason: h["why"], Since: fromMs(h["since"]),
		FirstSeen: fromMs(h["first"]), CheckedAt: fromMs(h["checked"]), Exempt: h["ex"] == "1",
		Rung: atoi(h["rung"]), WarnedAt: fromMs(h["warned"]), AgeWarnedAt: fromMs(h["agewarned"]),
		ExtendedUntil: fromMs(h["extuntil"]), Extended: time.Duration(ext) * time.Millisecond,
		ShrunkFrom: atoi(h["shrunk"]), ShrunkLimitFrom: atoi(h["shrunklim"]), StoppedAt: fromMs(h["stopped"]),
	}
}

// IdleStates returns the stored idle state of each spawn, in order, read in
// pipelined batches; a spawn without one has only SpawnID set.
func (r *Reclaim) IdleStates(ctx context.Context, spawnIDs []string) ([]reclaim.IdleState, error) {
	out := make([]reclaim.IdleState, len(spawnIDs))
	for lo := 0; lo < len(spawnIDs); lo += stateBatch {
		hi := min(lo+stateBatch, len(spawnIDs))
		cmds := make([]*redis.MapStringStringCmd, hi-lo)
		octx, cancel := r.op(ctx)
		_, err := r.rdb.Pipelined(octx, func(p redis.Pipeliner) error {
			for i := lo; i < hi; i++ {
				cmds[i-lo] = p.HGetAll(octx, r.k.IdleState(spawnIDs[i]))
			}
			return nil
		})
		cancel()
		if err != nil {
			return nil, fmt.Errorf("read %d idle states: %w", hi-lo, err)
		}
		for i := lo; i < hi; i++ {
			out[i] = decodeState(spawnIDs[i], cmds[i-lo].Val())
		}
	}
	return out, nil
}

// SaveIdleStates writes the cycle's fields of each state, each with its
// TTL (IdleStateTTL), in pipelined batches; it never writes the extension
// fields.
func (r *Reclaim) SaveIdleStates(ctx context.Context, states []reclaim.IdleState) error {
	for lo := 0; lo < len(states); lo += stateBatch {
		hi := min(lo+stateBatch, len(states))
		octx, cancel := r.op(ctx)
		_, err := r.rdb.Pipelined(octx, func(p redis.Pipeliner) error {
			for _, st := range states[lo:hi] {
				k := r.k.IdleState(st.SpawnID)
				p.HSet(octx, k, stateFields(st)...)
				p.PExpire(octx, k, IdleStateTTL)
			}
			return nil
		})
		cancel()
		if err != nil {
			return fmt.Errorf("save %d idle states: %w", hi-lo, err)
		}
	}
	return nil
}

// ExtendIdle grants an extension of d to spawnID's idle clock at now if
// the spawn's total stays within limit (scripts/extend_idle.lua).
func (r *Reclaim) ExtendIdle(ctx context.Context, spawnID string, now time.Time, d, limit time.Duration) (reclaim.Extension, error) {
	ctx, cancel := r.op(ctx)
	defer cancel()
	res, err := extendIdleScript.Run(ctx, r.rdb, []string{r.k.IdleState(spawnID)},
		now.UnixMilli(), d.Milliseconds(), limit.Milliseconds(), IdleStateTTL.Milliseconds()).Int64Slice()
	if err != nil {
		return reclaim.Extension{}, fmt.Errorf("extend idle state of %s: %w", spawnID, err)
	}
	switch {
	case len(res) == 2 && res[0] == 0:
		return reclaim.Extension{Total: time.Duration(res[1]) * time.Millisecond}, nil
	case len(res) == 3 && res[0] == 1:
		return reclaim.Extension{Granted: true, Until: time.UnixMilli(res[1]).UTC(), Total: time.Duration(res[2]) * time.Millisecond}, nil
	}
	return reclaim.Extension{}, fmt.Errorf("extend idle state of %s: script returned %v", spawnID, res)
}
