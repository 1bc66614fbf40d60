// Package reclaim decides when a running server counts as idle and what
// happens then: the versioned, audited reclaim Policy (PolicyStore), and
// the Reclaimer that checks every running server each interval and walks
// the ladder warn → shrink → stop.
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
//   - Extensions are granted by one Lua script against the per-spawn limit;
//     the cycle never writes the extension fields, so it cannot undo one.
//   - Exactly one replica runs the cycle: the composition root runs it under
//     broker/internal/leader (a Lease released on shutdown only after the
//     cycle stopped).
//
// Redis keys: redisschema.Keys (the reclaim: keys and the audit log).
package reclaim
