package agentstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Tuning of FollowAudit.
const (
	// auditBlock bounds one wait for new records, so a cancelled follower
	// returns promptly.
	auditBlock = 2 * time.Second
	// auditClaimIdle is the default of how long a delivered record may stay
	// unacknowledged (its handler failed, or its consumer died) before any
	// consumer of the group takes it over and handles it again
	// (WithAuditRetry).
	auditClaimIdle = 30 * time.Second
	// auditBatch is how many records one read returns at most.
	auditBatch = 100
)

// Reasons of audit records: why the agent acted (limiter/agent decides).
const (
	// ReasonOverMemory: a slice's processes held more device memory than
	// its cap plus the tolerance (NVML's view) for the configured number of
	// samples; the slice's largest process is the target.
	ReasonOverMemory = "over-memory"
	// ReasonHidden: a GPU process in a slice's pod had no slot in the
	// slice's usage region for the configured number of samples: it reached
	// the GPU past the hook (a static binary, raw ioctls, the driver's
	// symbol table read by hand).
	ReasonHidden = "hidden"
	// ReasonNoSlice: a GPU process in no slice, past the orphan grace.
	// Stopped only when it runs in a pod; the host's own processes are only
	// reported.
	ReasonNoSlice = "no-slice"
	// ReasonUsageTampered: the slice's usage region was replaced or made
	// unusable; reported once per change, no process (Error says how).
	ReasonUsageTampered = "usage-tampered"
	// ReasonOverCompute: a slice's processes used more of the GPU's SMs
	// than its burst ceiling (computeLimitPercent) plus the compute
	// tolerance (NVML's view) for the configured number of samples: its
	// pacing was defeated (the tenant wrote the usage region's pace fields,
	// or launched kernels past the hook). The slice's busiest process is
	// the target.
	ReasonOverCompute = "over-compute"
)

// Actions of audit records.
const (
	ActionReport     = "report"      // recorded only
	ActionKill       = "kill"        // the process was stopped (SIGKILL)
	ActionKillFailed = "kill-failed" // stopping it failed; Error says why
)

// AuditRecord is one enforcement decision of an agent (ARCHITECTURE.md invariant
// 6: actor, target, action, reason, policy and the inputs).
type AuditRecord struct {
	// ID is the stream entry id; set by reads, ignored by writes.
	ID   string    `json:"-"`
	At   time.Time `json:"at"`
	Node string    `json:"node"` // the actor: gpubroker-agent on this node
	// Action is ActionReport, ActionKill or ActionKillFailed.
	Action string `json:"action"`
	// Reason is one of the Reason* constants.
	Reason string `json:"reason"`
	// Policy names the configured policy, e.g. "kill tolerance=5% compute-tolerance=10 samples=3 orphan-grace=30s".
	Policy    string `json:"policy"`
	Slice     string `json:"slice,omitempty"`
	Pod       string `json:"pod,omitempty"`
	Namespace string `json:"namespace,omitempty"`
	// User and Server are the server's raw names from its pod's
	// annotations ("" for no-slice): the broker shows the record on that
	// server's events.
	User      string `json:"user,omitempty"`
	Server    string `json:"server,omitempty"`
	Container string `json:"container,omitempty"`
	PID       uint32 `json:"pid"`
	GPU       string `json:"gpu"`
	// MemoryUsedMiB is the target's memory as NVML reported it (the
	// process's, or the slice's for over-memory).
	MemoryUsedMiB int64 `json:"memoryUsedMiB"`
	// ProcessMemoryMiB is the acted-on process's own memory (NVML); 0 when
	// unknown or for usage-tampered.
	ProcessMemoryMiB int64 `json:"processMemoryMiB,omitempty"`
	// MemoryLimitMiB is the slice's cap; 0 for no-slice.
	MemoryLimitMiB int64 `json:"memoryLimitMiB"`
	// SMPercent is the slice's SM share (NVML, percent of the GPU) and
	// ComputeLimitPercent its burst ceiling, for over-compute; 0 otherwise.
	SMPercent           int `json:"smPercent,omitempty"`
	ComputeLimitPercent int `json:"computeLimitPercent,omitempty"`
	// Samples is how many consecutive samples the condition held.
	Samples int    `json:"samples"`
	Error   string `json:"error,omitempty"`
}

// AddAudit appends r to the audit stream (trimmed to about 10,000 records).
func (st *Store) AddAudit(ctx context.Context, r AuditRecord) error {
	b, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	ctx, cancel := st.op(ctx)
	defer cancel()
	err = st.rdb.XAdd(ctx, &redis.XAddArgs{
		Stream: st.k.AgentAudit(), MaxLen: auditMaxLen, Approx: true, ID: "*", Values: []any{"r", b},
	}).Err()
	if err != nil {
		return fmt.Errorf("audit %s %s pid %d: %w", r.Action, r.Reason, r.PID, err)
	}
	return nil
}

// RecentAudit returns up to n of the newest audit records, newest first.
func (st *Store) RecentAudit(ctx context.Context, n int64) ([]AuditRecord, error) {
	ctx, cancel := st.op(ctx)
	defer cancel()
	msgs, err := st.rdb.XRevRangeN(ctx, st.k.AgentAudit(), "+", "-", n).Result()
	if err != nil {
		return nil, fmt.Errorf("read audit: %w", err)
	}
	out := make([]AuditRecord, 0, len(msgs))
	for _, m := range msgs {
		r, err := decodeAudit(m)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// AuditBefore returns up to n audit records older than the stream id
// before ("" = from the newest), newest first, with their IDs, and the id
// to read on from (the oldest entry read; "" when the stream has no more).
// Records that do not decode are skipped, so a corrupt one never hides the
// rest. The broker's audit view pages through the agents' records this
// way.
func (st *Store) AuditBefore(ctx context.Context, before string, n int64) ([]AuditRecord, string, error) {
	end := "+"
	if before != "" {
		end = "(" + before
	}
	ctx, cancel := st.op(ctx)
	defer cancel()
	msgs, err := st.rdb.XRevRangeN(ctx, st.k.AgentAudit(), end, "-", n).Result()
	if err != nil {
		return nil, "", fmt.Errorf("read audit: %w", err)
	}
	out := make([]AuditRecord, 0, len(msgs))
	for _, m := range msgs {
		r, err := decodeAudit(m)
		if err != nil {
			continue
		}
		out = append(out, r)
	}
	next := ""
	if int64(len(msgs)) == n && n > 0 {
		next = msgs[len(msgs)-1].ID
	}
	return out, next, nil
}

// decodeAudit decodes one stream entry, its ID set.
func decodeAudit(m redis.XMessage) (AuditRecord, error) {
	v, _ := m.Values["r"].(string)
	var r AuditRecord
	if err := json.Unmarshal([]byte(v), &r); err != nil {
		return AuditRecord{}, fmt.Errorf("%w: audit %s: %w", ErrCorrupt, m.ID, err)
	}
	r.ID = m.ID
	return r, nil
}

// FollowAudit hands fn every audit record appended after the consumer group
// group was first created on the audit stream, once per group: the group's
// consumers (broker replicas, each with its own consumer name) share the
// records, and Redis remembers what the group has seen, so a restart neither
// repeats nor loses records. A record is acknowledged when fn returns nil.
// One whose fn failed, or whose consumer died before acknowledging it, is
// handed out again, to any consumer of the group, after it stayed
// unacknowledged for 30 s (WithAuditRetry). A record that does not decode is
// acknowledged and dropped (it would fail forever). FollowAudit blocks until ctx ends (then it
// returns nil) or Redis fails (the error; the caller retries). The group is
// stored on the stream (XGROUP, no key of its own).
func (st *Store) FollowAudit(ctx context.Context, group, consumer string, fn func(context.Context, AuditRecord) error) error {
	key := st.k.AgentAudit()
	cctx, cancel := st.op(ctx)
	err := st.rdb.XGroupCreateMkStream(cctx, key, group, "$").Err()
	cancel()
	if err != nil && !strings.Contains(err.Error(), "BUSYGROUP") {
		return fmt.Errorf("audit group %s: %w", group, err)
	}
	handle := func(msgs []redis.XMessage) error {
		for _, m := range msgs {
			if r, err := decodeAudit(m); err == nil {
				if fn(ctx, r) != nil {
					continue // left pending: handed out again after auditClaimIdle
				}
			}
			// fn has handled it: acknowledge it even if ctx ended meanwhile,
			// or another consumer would be handed it again after the claim
			// delay (a shutdown must not repeat a record).
			cctx, cancel := st.op(context.WithoutCancel(ctx))
			err := st.rdb.XAck(cctx, key, group, m.ID).Err()
			cancel()
			if err != nil {
				return fmt.Errorf("audit group %s: ack %s: %w", group, m.ID, err)
			}
		}
		return nil
	}
	for ctx.Err() == nil {
		cctx, cancel := st.op(ctx)
		claimed, _, err := st.rdb.XAutoClaim(cctx, &redis.XAutoClaimArgs{Stream: key, Group: group, Consumer: consumer,
			MinIdle: st.claimIdle, Start: "0-0", Count: auditBatch}).Result()
		cancel()
		if err != nil && ctx.Err() == nil {
			return fmt.Errorf("audit group %s: claim: %w", group, err)
		}
		if err := handle(claimed); err != nil {
			return err
		}
		streams, err := st.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: group, Consumer: consumer,
			Streams: []string{key, ">"}, Count: auditBatch, Block: auditBlock}).Result()
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, redis.Nil):
			continue
		case err != nil:
			return fmt.Errorf("audit group %s: read: %w", group, err)
		}
		for _, s := range streams {
			if err := handle(s.Messages); err != nil {
				return err
			}
		}
	}
	return nil
}
