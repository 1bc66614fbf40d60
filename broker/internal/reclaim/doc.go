// Package reclaim decides when a running server counts as idle and what
// happens then: the versioned, audited reclaim Policy (Policies), and the
// Reclaimer that checks every running server each interval and walks the
// ladder warn → shrink → stop.
//
// It is a domain package: it imports no infrastructure. The policy, its
// overrides (Effective), validation, the evidence rules (gpuEvidence,
// notebookEvidence) and the decision (decide, the ladder) are pure
// functions, table-tested. Everything it reads or writes goes through the
// small interfaces it declares, implemented elsewhere:
//
//   - PolicyStore and IdleStates: broker/internal/redisstore.Reclaim (Redis,
//     keys from broker/api/redisschema, Lua scripts embedded there);
//   - AuditLog: broker/internal/redisstore.AuditLog;
//   - Samples: redisstore.AgentSamples, which reads the node agents' samples
//     through limiter/agent/agentstore, the agent contract's one reader;
//   - Servers, Stopper, Shrinker: the server store and lifecycle;
//   - ActivityProber and HubNotifier: Prober and Hub in this package (plain
//     HTTP clients of the notebook servers and of JupyterHub).
//
// The policy's wire and stored form is v1.ReclaimPolicy (one schema end to
// end); PolicyFromAPI and Policy.API are its only converter. Leader
// election is the composition root's (broker/internal/leader).
//
// Invariants:
//
//   - Unknown never leads to an action (ARCHITECTURE.md invariant 4): no samples, a
//     stale newest sample, a missing SM reading or a failed notebook probe
//     give VerdictUnknown with the reason, and reset the idle clock.
//   - A server is active when its GPU is busy (a fresh sample above the
//     idle threshold, or a kernel launch) or its notebook is (a busy kernel,
//     even a silent one, or recent activity). The notebook is probed only
//     when the GPU looks idle; probes always carry no_track_activity=1.
//   - Idle states are keyed by spawn id: every start has a fresh clock.
//   - An action never comes sooner than the policy's Warn after its notice;
//     one rung per server per cycle.
//   - Every action is audited (actor, target, action, reason, policy
//     version, inputs) and, unless the policy is a dry run, an event on the
//     server's stream. Dry run writes audit records only.
//   - Exempt users and groups (and exempt overrides) are never reclaimed.
//   - Extensions are granted atomically against the per-spawn limit
//     (IdleStates.ExtendIdle); the cycle never writes the extension fields,
//     so it cannot undo one, and it reads the idle state again right before
//     an idle stop or shrink, so an extension granted while it probed the
//     notebooks holds.
//   - A shrink that took effect stays on the ladder (and is restored once
//     the notebook is busy) even when its event or audit write failed.
//   - Exactly one replica runs the cycle: the composition root runs it under
//     broker/internal/leader (a Lease released on shutdown only after the
//     cycle stopped).
package reclaim
