package redisstore

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/gpubroker/gpubroker/broker/api/redisschema"
	"github.com/gpubroker/gpubroker/broker/internal/reclaim"
)

// AuditLog is the broker's audit log in Redis: one stream
// (redisschema.Keys.Audit), trimmed to about auditMaxLen entries, each
// entry's field "entry" holding its JSON. Safe for concurrent use.
type AuditLog struct {
	rdb       redis.UniversalClient
	k         redisschema.Keys
	opTimeout time.Duration
}

// auditMaxLen is the approximate number of audit entries kept.
const auditMaxLen = 10000

// NewAuditLog returns the audit log on client under prefix. It does no I/O.
func NewAuditLog(client redis.UniversalClient, prefix string) *AuditLog {
	return &AuditLog{rdb: client, k: redisschema.New(prefix), opTimeout: reclaimOpTimeout}
}

// AppendAudit adds e to the audit log.
func (l *AuditLog) AppendAudit(ctx context.Context, e reclaim.AuditEntry) error {
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

// Audit returns the newest entries matching q, newest first, and the
// cursor of the next page ("" when there is none). Entries that do not
// decode are skipped.
func (l *AuditLog) Audit(ctx context.Context, q reclaim.AuditQuery) ([]reclaim.AuditEntry, string, error) {
	if q.Limit <= 0 {
		q.Limit = 50
	}
	q.Limit = min(q.Limit, 200)
	ctx, cancel := context.WithTimeout(ctx, l.opTimeout)
	defer cancel()
	end := "+"
	if q.Before != "" {
		end = "(" + q.Before
	}
	var out []reclaim.AuditEntry
	const batch = 500
	for scanned := 0; scanned < auditMaxLen*2; scanned += batch {
		msgs, err := l.rdb.XRevRangeN(ctx, l.k.Audit(), end, "-", batch).Result()
		if err != nil {
			return nil, "", fmt.Errorf("read audit log: %w", err)
		}
		for _, m := range msgs {
			raw, _ := m.Values["entry"].(string)
			var e reclaim.AuditEntry
			if json.Unmarshal([]byte(raw), &e) != nil {
				continue
			}
			e.ID = m.ID
			if (q.Actor == "" || strings.EqualFold(q.Actor, e.Actor)) && (q.Action == "" || q.Action == e.Action) && (q.Target == "" || q.Target == e.Target) {
				if len(out) == q.Limit {
					return out, out[len(out)-1].ID, nil
				}
				out = append(out, e)
			}
		}
		if len(msgs) < batch {
			break
		}
		end = "(" + msgs[len(msgs)-1].ID
	}
	return out, "", nil
}
