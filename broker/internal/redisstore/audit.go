package redisstore

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/gpubroker/gpubroker/broker/api/redisschema"
	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/audit"
	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
)

// AuditLog is the one audit view: the broker's own log (one stream,
// redisschema.Keys.Audit, trimmed to about auditMaxLen entries, each
// entry's field "entry" holding the JSON of a v1.AuditEntry) merged with
// the node agents' enforcement records (read through agentstore, the
// agent contract's one reader), newest first, filterable by source. Safe
// for concurrent use.
type AuditLog struct {
	rdb       redis.UniversalClient
	k         redisschema.Keys
	agents    *agentstore.Store
	opTimeout time.Duration
}

// Bounds of the audit log.
const (
	// auditMaxLen is the approximate number of the broker's entries kept.
	auditMaxLen = 10000
	// auditBatch is how many entries one read of a source takes.
	auditBatch = 500
	// auditScan bounds the entries one page reads (of all sources), so a
	// filter that matches little cannot read the whole log.
	auditScan = 4 * auditMaxLen
)

// NewAuditLog returns the audit log on client under prefix; agents, when
// not nil, adds the node agents' records. It does no I/O.
func NewAuditLog(client redis.UniversalClient, prefix string, agents *agentstore.Store) *AuditLog {
	return &AuditLog{rdb: client, k: redisschema.New(prefix), agents: agents, opTimeout: reclaimOpTimeout}
}

// AppendAudit adds e to the broker's log.
func (l *AuditLog) AppendAudit(ctx context.Context, e audit.Entry) error {
	b, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("encode audit entry: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, l.opTimeout)
	defer cancel()
	if err := l.rdb.XAdd(ctx, &redis.XAddArgs{Stream: l.k.Audit(), MaxLen: auditMaxLen, Approx: true, Values: []any{"entry", string(b)}}).Err(); err != nil {
		return fmt.Errorf("append audit entry: %w", err)
	}
	return nil
}

// source is one log being read backwards in batches.
type source struct {
	read func(ctx context.Context, before string) ([]audit.Entry, string, error) // a batch and where to read on ("" = no more)
	from string                                                                  // where the next batch starts ("" = the newest)
	buf  []audit.Entry
	done bool
	pos  string // the id of the last entry taken ("" = none: the cursor's own)
}

// head returns the source's next entry, reading a batch when needed; nil
// when the source has no more.
func (s *source) head(ctx context.Context) (*audit.Entry, error) {
	for len(s.buf) == 0 && !s.done {
		batch, next, err := s.read(ctx, s.from)
		if err != nil {
			return nil, err
		}
		s.buf, s.from, s.done = batch, next, next == ""
	}
	if len(s.buf) == 0 {
		return nil, nil
	}
	return &s.buf[0], nil
}

// readBroker reads a batch of the broker's log older than before.
func (l *AuditLog) readBroker(ctx context.Context, before string) ([]audit.Entry, string, error) {
	end := "+"
	if before != "" {
		end = "(" + before
	}
	msgs, err := l.rdb.XRevRangeN(ctx, l.k.Audit(), end, "-", auditBatch).Result()
	if err != nil {
		return nil, "", fmt.Errorf("read audit log: %w", err)
	}
	out := make([]audit.Entry, 0, len(msgs))
	for _, m := range msgs {
		raw, _ := m.Values["entry"].(string)
		var e audit.Entry
		if json.Unmarshal([]byte(raw), &e) != nil {
			continue // an entry this code cannot read is left out, not fatal
		}
		e.ID = m.ID
		if e.Source == "" {
			e.Source = v1.AuditSourceReclaim
		}
		out = append(out, e)
	}
	next := ""
	if len(msgs) == auditBatch {
		next = msgs[len(msgs)-1].ID
	}
	return out, next, nil
}

// readAgents reads a batch of the agents' records older than before.
func (l *AuditLog) readAgents(ctx context.Context, before string) ([]audit.Entry, string, error) {
	recs, next, err := l.agents.AuditBefore(ctx, before, auditBatch)
	if err != nil {
		return nil, "", err
	}
	out := make([]audit.Entry, len(recs))
	for i, r := range recs {
		out[i] = agentEntry(r)
	}
	return out, next, nil
}

// agentEntry is an agent's enforcement record as an audit entry.
func agentEntry(r agentstore.AuditRecord) audit.Entry {
	e := audit.Entry{ID: r.ID, Time: r.At.UTC(), Source: v1.AuditSourceAgent, Actor: "gpubroker-agent@" + r.Node,
		ActorKind: v1.ActorAgent, Action: "agent." + r.Action, Reason: r.Reason, Inputs: map[string]string{}}
	switch {
	case r.User != "" && r.Server != "":
		// The server's own target, so that filtering by server finds it.
		e.Target = audit.ServerTarget(r.User, r.Server)
	case r.Pod != "":
		e.Target = "pod:" + r.Namespace + "/" + r.Pod
	case r.Slice != "":
		e.Target = "slice:" + r.Slice
	default:
		e.Target = "process:" + strconv.FormatUint(uint64(r.PID), 10) + "@" + r.Node
	}
	put := func(k, v string) {
		if v != "" {
			e.Inputs[k] = v
		}
	}
	put("policy", r.Policy)
	put("slice", r.Slice)
	if r.Pod != "" {
		put("pod", r.Namespace+"/"+r.Pod)
	}
	put("container", r.Container)
	put("gpu", r.GPU)
	put("error", r.Error)
	put("pid", strconv.FormatUint(uint64(r.PID), 10))
	put("memoryUsedMiB", strconv.FormatInt(r.MemoryUsedMiB, 10))
	if r.MemoryLimitMiB > 0 {
		put("memoryLimitMiB", strconv.FormatInt(r.MemoryLimitMiB, 10))
	}
	if r.SMPercent > 0 || r.ComputeLimitPercent > 0 {
		put("smPercent", strconv.Itoa(r.SMPercent))
		put("computeLimitPercent", strconv.Itoa(r.ComputeLimitPercent))
	}
	put("samples", strconv.Itoa(r.Samples))
	return e
}

// Audit returns a page of the merged log, newest first, matching q, and
// the cursor of the next page ("" when there is none). Entries of the two
// sources are ordered by their stream ids (Redis's clock, the same for
// both); on equal ids the broker's comes first. The cursor holds the
// position in each source, so no entry is skipped or repeated at a page's
// edge.
func (l *AuditLog) Audit(ctx context.Context, q audit.Query) ([]audit.Entry, string, error) {
	if q.Limit <= 0 {
		q.Limit = 50
	}
	q.Limit = min(q.Limit, 200)
	var cur audit.Cursor
	if q.Before != "" {
		var ok bool
		if cur, ok = audit.ParseCursor(q.Before); !ok {
			return nil, "", fmt.Errorf("audit cursor %q is not one of a previous page", q.Before)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, l.opTimeout)
	defer cancel()
	broker := &source{read: l.readBroker, from: cur.Reclaim, pos: cur.Reclaim, done: q.Source == v1.AuditSourceAgent}
	agents := &source{read: l.readAgents, from: cur.Agent, pos: cur.Agent,
		done: l.agents == nil || (q.Source != "" && q.Source != v1.AuditSourceAgent)}
	var out []audit.Entry
	for scanned := 0; scanned < auditScan; scanned++ {
		b, err := broker.head(ctx)
		if err != nil {
			return nil, "", err
		}
		a, err := agents.head(ctx)
		if err != nil {
			return nil, "", err
		}
		var s *source
		switch {
		case b == nil && a == nil:
			return out, "", nil
		case a == nil || (b != nil && !audit.Less(b.ID, a.ID)):
			s = broker
		default:
			s = agents
		}
		e := s.buf[0]
		if q.Matches(e) {
			if len(out) == q.Limit {
				return out, audit.Cursor{Reclaim: broker.pos, Agent: agents.pos}.String(), nil
			}
			out = append(out, e)
		}
		s.buf, s.pos = s.buf[1:], e.ID
	}
	return out, audit.Cursor{Reclaim: broker.pos, Agent: agents.pos}.String(), nil
}
