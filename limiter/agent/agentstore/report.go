package agentstore

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

// NodeReport is what an agent says about its node at each heartbeat.
type NodeReport struct {
	Node string `json:"node"`
	// At is when the agent wrote the report (agent's clock).
	At time.Time `json:"at"`
	// HeartbeatMs is the agent's heartbeat interval in milliseconds; the
	// report expires after StaleAfter of them.
	HeartbeatMs int64 `json:"heartbeatMs"`
	// SampleMs is the agent's sampling interval in milliseconds.
	SampleMs int64       `json:"sampleMs"`
	GPUs     []GPUReport `json:"gpus"`
}

// GPUReport is one GPU of a node report: its inventory (v1.GPU, Healthy
// included) and why it is unhealthy.
type GPUReport struct {
	v1.GPU
	// MIGEnabled is true when MIG mode is on; such a GPU is reported
	// unhealthy because slices are whole-GPU shares. False when off or not
	// supported.
	MIGEnabled bool `json:"migEnabled"`
	// Reason says why the GPU is unhealthy ("xid 79", "gpu lost: memory
	// info: GPU is lost", ...); "" when healthy.
	Reason string `json:"reason,omitempty"`
	// Since is when the GPU's health last changed (agent's clock).
	Since time.Time `json:"since"`
}

// Heartbeat stores r as its node's report with a TTL of StaleAfter
// heartbeat intervals and records the heartbeat time in the node index.
func (st *Store) Heartbeat(ctx context.Context, r NodeReport) error {
	if r.Node == "" || r.HeartbeatMs <= 0 {
		return fmt.Errorf("heartbeat: node %q with interval %d ms: node and a positive interval are required", r.Node, r.HeartbeatMs)
	}
	b, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("heartbeat %s: %w", r.Node, err)
	}
	ctx, cancel := st.op(ctx)
	defer cancel()
	ttl := time.Duration(StaleAfter*r.HeartbeatMs) * time.Millisecond
	_, err = st.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, st.k.AgentNode(r.Node), b, ttl)
		p.ZAdd(ctx, st.k.AgentNodes(), redis.Z{Score: float64(r.At.UnixMilli()), Member: r.Node})
		return nil
	})
	if err != nil {
		return fmt.Errorf("heartbeat %s: %w", r.Node, err)
	}
	return nil
}

// NodeStatus is a node as the broker sees it through the agent contract.
type NodeStatus struct {
	Node string
	// LastHeartbeat is the time of the node's last heartbeat.
	LastHeartbeat time.Time
	// Report is the last report, nil when it expired or was never written.
	Report *NodeReport
	// Stale is true when Report is nil or older than StaleAfter heartbeat
	// intervals at the reader's now: the node's GPUs are then of unknown
	// health and must not receive new slices.
	Stale bool
}

// Nodes returns every node in the node index with its report, sorted by
// name. now is the reader's clock.
func (st *Store) Nodes(ctx context.Context, now time.Time) ([]NodeStatus, error) {
	ctx, cancel := st.op(ctx)
	defer cancel()
	zs, err := st.rdb.ZRangeWithScores(ctx, st.k.AgentNodes(), 0, -1).Result()
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	if len(zs) == 0 {
		return nil, nil
	}
	keys := make([]string, len(zs))
	for i, z := range zs {
		name, ok := z.Member.(string)
		if !ok {
			return nil, fmt.Errorf("%w: node index member %v", ErrCorrupt, z.Member)
		}
		keys[i] = st.k.AgentNode(name)
	}
	// One key per MGET call would be needed on Redis Cluster without a hash
	// tag; all keys share redisschema.HashTag, so one MGET works everywhere.
	vals, err := st.rdb.MGet(ctx, keys...).Result()
	if err != nil {
		return nil, fmt.Errorf("read node reports: %w", err)
	}
	out := make([]NodeStatus, 0, len(zs))
	var errs []error
	for i, z := range zs {
		ns := NodeStatus{Node: z.Member.(string), LastHeartbeat: time.UnixMilli(int64(z.Score)).UTC(), Stale: true}
		if v, ok := vals[i].(string); ok {
			var r NodeReport
			if err := json.Unmarshal([]byte(v), &r); err != nil {
				errs = append(errs, fmt.Errorf("%w: node %s report: %w", ErrCorrupt, ns.Node, err))
			} else {
				ns.Report = &r
				ns.Stale = r.HeartbeatMs <= 0 || now.Sub(r.At) > time.Duration(StaleAfter*r.HeartbeatMs)*time.Millisecond
			}
		}
		out = append(out, ns)
	}
	slices.SortFunc(out, func(a, b NodeStatus) int { return cmp.Compare(a.Node, b.Node) })
	return out, errors.Join(errs...)
}

// Inventory is what the broker registers for placement from the node
// reports at now: GPUs lists every GPU of every fresh report (unhealthy ones
// with Healthy false), StaleNodes the nodes whose agent stopped reporting;
// the broker marks their GPUs unhealthy (unknown is never healthy).
type Inventory struct {
	GPUs       []GPUReport
	StaleNodes []string
}

// Inventory reads the node reports and splits them per Inventory. A corrupt
// report makes its node stale and is reported in the (joined) error, with
// the rest of the inventory still returned.
func (st *Store) Inventory(ctx context.Context, now time.Time) (Inventory, error) {
	nodes, err := st.Nodes(ctx, now)
	var inv Inventory
	for _, n := range nodes {
		if n.Stale {
			inv.StaleNodes = append(inv.StaleNodes, n.Node)
			continue
		}
		inv.GPUs = append(inv.GPUs, n.Report.GPUs...)
	}
	return inv, err
}
