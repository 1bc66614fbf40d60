package agentstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

// Registry is the broker's GPU inventory as SyncInventory needs it; the
// broker adapts its store (redisstore.Store with fleet.GPU ↔ v1.GPU).
type Registry interface {
	// RegisterGPU adds or updates a GPU, health included.
	RegisterGPU(ctx context.Context, g v1.GPU) error
	// SetGPUHealth marks a registered GPU healthy or not.
	SetGPUHealth(ctx context.Context, uuid string, healthy bool) error
	// GPUs lists every registered GPU.
	GPUs(ctx context.Context) ([]v1.GPU, error)
}

// SyncInventory brings the broker's GPU inventory in line with the node
// reports at now (the broker's clock):
//   - every GPU of a fresh report is registered as reported (an unhealthy
//     one with Healthy false; its reason stays in the report);
//   - a registered, healthy GPU whose node is stale, or whose node's fresh
//     report no longer lists it, is marked unhealthy: unknown is never
//     healthy (ARCHITECTURE.md invariant 4), and its allocations stay;
//   - a reported mode ("" = no opinion) that is not the mode in force, or
//     a mode still pending, is registered again at every call, so it takes
//     effect once the GPU is empty (the registry decides);
//   - each fresh node's agent is told the modes in force on its GPUs
//     (SetModes), so it runs MPS daemons where they are needed.
//
// Registered GPUs of nodes that never reported (registered by hand or by
// dev mode) are left alone. Unchanged GPUs are not rewritten. It is
// idempotent; the broker runs it every few
// seconds (a heartbeat interval or less), from one replica or from all
// (every write is a whole-record update). Errors are joined; the rest of
// the inventory is still synced.
func (st *Store) SyncInventory(ctx context.Context, now time.Time, reg Registry) error {
	nodes, err := st.Nodes(ctx, now)
	var errs []error
	if err != nil {
		errs = append(errs, err)
	}
	if nodes == nil {
		return errors.Join(errs...)
	}
	registered, err := reg.GPUs(ctx)
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("list registered gpus: %w", err))...)
	}
	have := make(map[string]v1.GPU, len(registered))
	for _, g := range registered {
		have[g.UUID] = g
	}
	fresh := map[string]map[string]bool{} // node → uuids reported
	stale := map[string]bool{}
	for _, n := range nodes {
		if n.Stale {
			stale[n.Node] = true
			continue
		}
		fresh[n.Node] = map[string]bool{}
		for _, g := range n.Report.GPUs {
			fresh[n.Node][g.UUID] = true
			if cur, ok := have[g.UUID]; ok && sameInventory(cur, g.GPU) {
				continue // unchanged: no write
			}
			if err := reg.RegisterGPU(ctx, g.GPU); err != nil {
				errs = append(errs, fmt.Errorf("register gpu %s of node %s: %w", g.UUID, n.Node, err))
			}
		}
	}
	modes := map[string]map[string]v1.SharingMode{}
	for _, g := range registered {
		if fresh[g.Node] != nil && g.Mode != "" {
			if modes[g.Node] == nil {
				modes[g.Node] = map[string]v1.SharingMode{}
			}
			modes[g.Node][g.UUID] = g.Mode
		}
		gone := fresh[g.Node] != nil && !fresh[g.Node][g.UUID]
		if g.Healthy && (stale[g.Node] || gone) {
			if err := reg.SetGPUHealth(ctx, g.UUID, false); err != nil {
				errs = append(errs, fmt.Errorf("mark gpu %s of node %s unhealthy: %w", g.UUID, g.Node, err))
			}
		}
	}
	for node := range fresh {
		if err := st.SetModes(ctx, node, modes[node]); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// sameInventory reports whether the registered GPU reg already is what
// the report rep says: the same inventory, and either no mode asked for or
// the asked mode in force with none pending.
func sameInventory(reg, rep v1.GPU) bool {
	mode, pending := reg.Mode, reg.PendingMode
	reg.Mode, reg.PendingMode = rep.Mode, ""
	if reg != rep {
		return false
	}
	return pending == "" && (rep.Mode == "" || rep.Mode == mode)
}
