package servers

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
)

// EnforcementGroup is the consumer group in which the broker replicas share
// the node agents' audit records (agentstore.Store.FollowAudit): each record
// is told to its server once, whichever replica handles it.
const EnforcementGroup = "broker-events"

// AuditFollower hands out the node agents' audit records (implemented by
// limiter/agent/agentstore.Store).
type AuditFollower interface {
	FollowAudit(ctx context.Context, group, consumer string, fn func(context.Context, agentstore.AuditRecord) error) error
}

// followRetry is how long FollowEnforcement waits after Redis failed before it follows again.
const followRetry = 2 * time.Second

// FollowEnforcement tells servers what the node agents did to their
// processes (HandleEnforcement), for every audit record the agents write,
// as consumer (a name unique to this replica, e.g. the pod name) of
// EnforcementGroup. It follows again after a Redis failure and returns nil
// when ctx ends.
func (s *Service) FollowEnforcement(ctx context.Context, audits AuditFollower, consumer string) error {
	for {
		err := audits.FollowAudit(ctx, EnforcementGroup, consumer, s.HandleEnforcement)
		if ctx.Err() != nil {
			return nil
		}
		s.log.WarnContext(ctx, "following the node agents' enforcement failed; retrying", "err", err)
		t := time.NewTimer(followRetry)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// HandleEnforcement records what a node agent did about a process of a
// server (ARCHITECTURE.md invariant 3: stopped or reported because it used
// more than the server's slice, or used the GPU past the limiter) as an
// event of the server, in the user's words (EnforcementMessage); that is also
// the server's message, which its page shows. The server's state does not
// change. Records that name no server (a process in no slice), an older
// spawn, or a server that is not running are dropped. It returns an error
// only when storage failed, so that the record is handed out again.
func (s *Service) HandleEnforcement(ctx context.Context, r agentstore.AuditRecord) error {
	if r.User == "" || r.Slice == "" {
		return nil
	}
	key := fleet.ServerKey{User: r.User, Name: r.Server}
	rec, err := s.store.GetServer(ctx, key)
	if errors.Is(err, fleet.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("enforcement on %s/%s: %w", r.User, r.Server, err)
	}
	if rec.SpawnID != r.Slice || rec.State != v1.StateRunning {
		return nil
	}
	msg := EnforcementMessage(r)
	_, err = s.store.Transition(ctx, key, rec.SpawnID, v1.StateRunning, msg, fleet.ServerPatch{})
	if err = ignoreConflict(err); err != nil {
		return fmt.Errorf("enforcement on %s/%s: %w", r.User, r.Server, err)
	}
	s.log.InfoContext(ctx, "enforcement told to the server", "user", r.User, "server", r.Server, "slice_id", r.Slice,
		"action", r.Action, "reason", r.Reason)
	return nil
}

// EnforcementMessage says in the user's words what the agent's record r
// did, for example "a process used 12.1 GiB of this server's 8 GiB slice and
// was stopped".
func EnforcementMessage(r agentstore.AuditRecord) string {
	var done string
	switch r.Action {
	case agentstore.ActionKill:
		done = "was stopped"
	case agentstore.ActionKillFailed:
		done = "could not be stopped (" + r.Error + ")"
	default:
		done = "was reported, not stopped (this node only reports)"
	}
	switch r.Reason {
	case agentstore.ReasonOverMemory:
		if p := r.ProcessMemoryMiB; p > 0 && p*100 < r.MemoryUsedMiB*99 {
			return fmt.Sprintf("this server's processes used %s of its %s slice; the largest, using %s, %s",
				size(r.MemoryUsedMiB), size(r.MemoryLimitMiB), size(p), done)
		}
		return fmt.Sprintf("a process used %s of this server's %s slice and %s", size(r.MemoryUsedMiB), size(r.MemoryLimitMiB), done)
	case agentstore.ReasonOverCompute:
		if r.Action == agentstore.ActionReport {
			// Nodes report compute over-use unless told to stop it.
			done = "was reported, not stopped"
		}
		return fmt.Sprintf("this server's processes used %d%% of the GPU's compute, more than its slice's %d%% limit; the busiest %s",
			r.SMPercent, r.ComputeLimitPercent, done)
	case agentstore.ReasonHidden:
		return fmt.Sprintf("a process used %s of GPU memory without going through this server's GPU limiter and %s",
			size(r.MemoryUsedMiB), done)
	case agentstore.ReasonUsageTampered:
		return "this server's GPU usage file was replaced or damaged (" + r.Error +
			"): its programs can no longer allocate GPU memory; restart the server"
	}
	return "a process broke this server's GPU slice (" + r.Reason + ") and " + done
}

// size formats MiB in the unit people read: "512 MiB", "8 GiB", "12.1 GiB".
func size(mib int64) string {
	if mib < 1024 {
		return strconv.FormatInt(mib, 10) + " MiB"
	}
	g := strconv.FormatFloat(float64(mib)/1024, 'f', 1, 64)
	return strings.TrimSuffix(g, ".0") + " GiB"
}
