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

// GPUReport is one device of a node report: its inventory (v1.GPU,
// Healthy included) and why it is unhealthy. A GPU in MIG mode is reported
// with Mode mig and each of its MIG instances as a device of its own
// (ParentUUID, MIGProfile and ComputePercent set), after their GPU.
// Otherwise Mode is the mode the node's label asks for ("" without one).
type GPUReport struct {
	v1.GPU
	// MIGEnabled is true when MIG mode is on (the GPU is then placed
	// through its instances); false when off or not supported.
	MIGEnabled bool `json:"migEnabled"`
	// GPUInstanceID and ComputeInstanceID name a MIG instance within its
	// GPU, as NVML does (nvidia-smi's GI and CI); 0 for a GPU.
	GPUInstanceID     int `json:"gpuInstanceId,omitempty"`
	ComputeInstanceID int `json:"computeInstanceId,omitempty"`
	// Guarantee is how often the GPU's sliced and MPS tenants got their
	// guaranteed compute when they asked for it, over the agent's window
	// (an hour); nil when no tenant asked, or for MIG instances.
	Guarantee *v1.Guarantee `json:"guarantee,omitempty"`
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

// ModesTTL is how long the broker's record of a node's GPU modes lives
// after its last write; the broker rewrites it at every inventory sync.
const ModesTTL = time.Minute

// SetModes records, for node's agent, the sharing mode in force on each of
// the node's GPUs (gpu uuid → mode), replacing what was there. The broker
// calls it from SyncInventory.
func (st *Store) SetModes(ctx context.Context, node string, modes map[string]v1.SharingMode) error {
	ctx, cancel := st.op(ctx)
	defer cancel()
	key := st.k.AgentModes(node)
	_, err := st.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Del(ctx, key)
		if len(modes) > 0 {
			args := make([]any, 0, 2*len(modes))
			for uuid, m := range modes {
				args = append(args, uuid, string(m))
			}
			p.HSet(ctx, key, args...)
			p.Expire(ctx, key, ModesTTL)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("set gpu modes of node %s: %w", node, err)
	}
	return nil
}

// Modes returns the sharing modes in force on node's GPUs as the broker
// last recorded them (SetModes); an empty map when it recorded none (a
// broker that is down: the agent keeps what it had). Values that are not
// a sharing mode are an error wrapping ErrCorrupt, the rest still returned.
func (st *Store) Modes(ctx context.Context, node string) (map[string]v1.SharingMode, error) {
	ctx, cancel := st.op(ctx)
	defer cancel()
	h, err := st.rdb.HGetAll(ctx, st.k.AgentModes(node)).Result()
	if err != nil {
		return nil, fmt.Errorf("read gpu modes of node %s: %w", node, err)
	}
	out := make(map[string]v1.SharingMode, len(h))
	var errs []error
	for uuid, m := range h {
		if mode := v1.SharingMode(m); mode.Valid() {
			out[uuid] = mode
		} else {
			errs = append(errs, fmt.Errorf("%w: gpu %s mode %q", ErrCorrupt, uuid, m))
		}
	}
	return out, errors.Join(errs...)
}
