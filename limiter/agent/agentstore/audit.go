package agentstore

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// AuditRecord is one enforcement decision of an agent (ARCHITECTURE.md invariant
// 6: actor, target, action, reason, policy and the inputs).
type AuditRecord struct {
	// ID is the stream entry id; set by reads, ignored by writes.
	ID   string    `json:"-"`
	At   time.Time `json:"at"`
	Node string    `json:"node"` // the actor: gpubroker-agent on this node
	// Action is "report", "kill" or "kill-failed".
	Action string `json:"action"`
	// Reason is "over-memory" (a slice's processes use more than its cap
	// beyond the tolerance) or "no-slice" (a GPU process of no slice).
	Reason string `json:"reason"`
	// Policy names the configured policy, e.g. "kill tolerance=5% samples=3".
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
	// process's for no-slice, the slice's for over-memory).
	MemoryUsedMiB int64 `json:"memoryUsedMiB"`
	// MemoryLimitMiB is the slice's cap; 0 for no-slice.
	MemoryLimitMiB int64 `json:"memoryLimitMiB"`
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
		v, _ := m.Values["r"].(string)
		var r AuditRecord
		if err := json.Unmarshal([]byte(v), &r); err != nil {
			return nil, fmt.Errorf("%w: audit %s: %w", ErrCorrupt, m.ID, err)
		}
		r.ID = m.ID
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
		v, _ := m.Values["r"].(string)
		var r AuditRecord
		if json.Unmarshal([]byte(v), &r) != nil {
			continue
		}
		r.ID = m.ID
		out = append(out, r)
	}
	next := ""
	if int64(len(msgs)) == n && n > 0 {
		next = msgs[len(msgs)-1].ID
	}
	return out, next, nil
}
