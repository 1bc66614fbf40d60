package servers

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strconv"
	"strings"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/audit"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// The audit actions of the lifecycle; their target is
// audit.ServerTarget(user, name).
const (
	auditCreate = "server.create"
	auditStop   = "server.stop"
	auditRemove = "server.remove"
	auditResize = "server.resize"
)

// record appends the audit entry of one lifecycle action by by on key with
// its inputs and, in inputs["outcome"] and the reason, how it ended: done,
// refused (err matches a refusal) or unknown (an outage). A failure to
// write it is logged: the action itself stands.
func (s *Service) record(ctx context.Context, by audit.Actor, action string, key fleet.ServerKey, inputs map[string]string, err error) {
	if s.audit == nil {
		return
	}
	e := audit.Entry{Time: s.now().UTC(), Source: v1.AuditSourceServers, Actor: by.Name, ActorKind: by.Kind,
		Action: action, Target: audit.ServerTarget(key.User, key.Name), Inputs: inputs}
	if e.Inputs == nil {
		e.Inputs = map[string]string{}
	}
	switch {
	case err == nil:
		e.Inputs["outcome"] = "done"
	case errors.Is(err, fleet.ErrUnavailable):
		e.Inputs["outcome"] = "unknown"
		e.Reason = fleet.Message(err)
	default:
		e.Inputs["outcome"] = "refused"
		e.Reason = fleet.Message(err)
	}
	if werr := s.audit.AppendAudit(ctx, e); werr != nil {
		s.log.WarnContext(ctx, "audit a lifecycle action", "action", action, "user", key.User, "server", key.Name, "err", werr)
	}
}

// createInputs are the inputs of a create worth keeping: the profile and
// its slice, the spawn and the names (never the values) of the
// environment, and how many command and args entries it set.
func createInputs(rec fleet.Server, prof fleet.Profile, req v1.CreateServerRequest, err error) map[string]string {
	in := map[string]string{
		"profile":             prof.Name,
		"spawnId":             rec.SpawnID,
		"memoryMiB":           strconv.FormatInt(prof.Slice.MemoryMiB, 10),
		"computePercent":      strconv.Itoa(prof.Slice.ComputePercent),
		"computeLimitPercent": strconv.Itoa(prof.Slice.ComputeLimitPercent),
	}
	if len(req.Env) > 0 {
		in["env"] = strings.Join(slices.Sorted(maps.Keys(req.Env)), ",")
	}
	if len(req.SecretEnv) > 0 {
		in["secretEnv"] = strings.Join(slices.Sorted(maps.Keys(req.SecretEnv)), ",")
	}
	if n := len(req.Command) + len(req.Args); n > 0 {
		in["commandEntries"] = strconv.Itoa(n)
	}
	return in
}

// byText names who acted in a server's events when it is not its user:
// " by root (an administrator)", " by the idle reclaimer".
func byText(by audit.Actor, user string) string {
	switch {
	case by.Kind == v1.ActorReclaimer:
		return " by the idle reclaimer"
	case by.Kind == v1.ActorAdmin && by.Name != user:
		return " by " + by.Name + " (an administrator)"
	case by.Kind == v1.ActorHub:
		return " through JupyterHub"
	}
	return ""
}
