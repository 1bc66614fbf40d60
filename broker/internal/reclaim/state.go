package reclaim

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/gpubroker/gpubroker/broker/api/redisschema"
)

// The reclaimer's idle states are redisschema.Keys.IdleState (see the
// table there). A spawn's state is keyed by its spawn id, so every start begins with a
// fresh clock; the TTL collects the states of spawns that ended.
const stateTTL = 8 * 24 * time.Hour

// IdleState is what the reclaimer knows about one spawn of a server.
type IdleState struct {
	// SpawnID is the spawn the state belongs to.
	SpawnID string
	// Verdict is the last verdict; "" when the reclaimer has not seen the
	// spawn yet.
	Verdict Verdict
	// Reason says why the verdict is active or unknown.
	Reason string
	// Since is when the current verdict began (for idle: the idle clock).
	Since time.Time
	// FirstSeen is the first cycle that saw the spawn running.
	FirstSeen time.Time
	// CheckedAt is when the state was last written.
	CheckedAt time.Time
	// Exempt: the server is exempt from reclaim by policy.
	Exempt bool
	// Rung counts the idle ladder's rungs done; WarnedAt is the time of the
	// last warning of the ladder (zero when none is pending).
	Rung     int
	WarnedAt time.Time
	// AgeWarnedAt is when the maximum-age warning was given (zero: not yet).
	AgeWarnedAt time.Time
	// ExtendedUntil: no idle action before this time; Extended is the
	// total extension granted to this spawn.
	ExtendedUntil time.Time
	Extended      time.Duration
	// ShrunkFrom is the guaranteed and burst compute before a shrink (0
	// when not shrunk).
	ShrunkFrom, ShrunkLimitFrom int
	// NextAction and NextAt are the next step of the ladder when the
	// server stays idle (empty when none); set by State, not stored.
	NextAction Action
	NextAt     time.Time
}

func (r *Reclaimer) stateKey(spawnID string) string {
	return redisschema.New(r.prefix).IdleState(spawnID)
}

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

// fields are the fields the cycle owns; the extension fields ("extuntil",
// "ext") are written only by the extend script, so a cycle never undoes an
// extension granted while it ran.
func (st IdleState) fields() []any {
	exempt := "0"
	if st.Exempt {
		exempt = "1"
	}
	return []any{
		"v", string(st.Verdict), "why", st.Reason, "since", msText(st.Since), "first", msText(st.FirstSeen),
		"checked", msText(st.CheckedAt), "ex", exempt, "rung", st.Rung, "warned", msText(st.WarnedAt),
		"agewarned", msText(st.AgeWarnedAt), "shrunk", st.ShrunkFrom, "shrunklim", st.ShrunkLimitFrom,
	}
}

func decodeState(spawnID string, h map[string]string) IdleState {
	atoi := func(s string) int { n, _ := strconv.Atoi(s); return n }
	ext, _ := strconv.ParseInt(h["ext"], 10, 64)
	return IdleState{
		SpawnID: spawnID, Verdict: Verdict(h["v"]), Reason: h["why"], Since: fromMs(h["since"]),
		FirstSeen: fromMs(h["first"]), CheckedAt: fromMs(h["checked"]), Exempt: h["ex"] == "1",
		Rung: atoi(h["rung"]), WarnedAt: fromMs(h["warned"]), AgeWarnedAt: fromMs(h["agewarned"]),
		ExtendedUntil: fromMs(h["extuntil"]), Extended: time.Duration(ext) * time.Millisecond,
		ShrunkFrom: atoi(h["shrunk"]), ShrunkLimitFrom: atoi(h["shrunklim"]),
	}
}

// saveStates writes states in one pipeline, each with its TTL.
func (r *Reclaimer) saveStates(ctx context.Context, states []IdleState) error {
	if len(states) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	_, err := r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, st := range states {
			k := r.stateKey(st.SpawnID)
			p.HSet(ctx, k, st.fields()...)
			p.PExpire(ctx, k, stateTTL)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("reclaim: save %d idle states: %w", len(states), err)
	}
	return nil
}
