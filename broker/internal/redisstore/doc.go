// Package redisstore keeps the broker's shared state in Redis: GPU
// inventory, slice placement, quota usage, server records and server event
// streams (Store, for the servers service and the reconciler); the reclaim
// policy with its history and the idle states (Reclaim, for
// broker/internal/reclaim); the web login's sessions (Sessions, for
// broker/internal/auth); the audit log (AuditLog: the broker's own log
// merged with the node agents' enforcement records); and the node agents'
// samples as the reclaimer reads them (AgentSamples). The agents' records
// are read through limiter/agent/agentstore, the agent contract's one
// reader: nothing here decodes the agents' streams. Each is safe for concurrent use by many
// goroutines and many broker replicas sharing one Redis (single node or
// Sentinel).
//
// # Invariants
//
//   - No GPU is overcommitted: for each GPU, Σ slice memory ≤ its memory
//     and Σ guaranteed compute ≤ 100. Place checks and charges in one Lua
//     script (scripts/place.lua); Release un-charges in one; Resize
//     (scripts/resize.lua) checks and charges the growth of a running
//     server's slice on the same GPU, its quotas and its record in one. Only Restore,
//     which records what pods prove exists, may exceed a GPU, and it says so
//     with an error wrapping fleet.ErrConflict.
//   - No quota is exceeded: Place checks the user's and every group's caps
//     (servers, memory, compute) and charges them in the same script.
//   - GPU, user and group counters always equal the sums over the stored
//     allocations; user and group counters are deleted when they reach
//     zero. Store.Verify checks this and the invariants above on an atomic
//     snapshot.
//   - Every healthy GPU is in exactly one free-memory index class (sorted
//     sets, score = free MiB): "avail" when it has compute left, "full"
//     otherwise; unhealthy GPUs are in none. Every script that changes a
//     GPU reindexes it in the same step, so placement walks O(log N +
//     skipped) entries from the smallest fitting score (binpack) or the
//     top (spread) instead of scanning all GPUs.
//   - Placement is refused with fleet.ErrNotReady while the reconcile marker
//     is missing: a flushed or restarted Redis has lost allocations that
//     pods still hold, and no slice may be placed before the reconciler has
//     restored them and called MarkReconciled.
//   - A server record changes only through scripts that compare its spawn
//     id: a late event of an old spawn never changes the current one. State
//     changes follow fleet.TransitionSources, and every change appends an
//     event to the server's stream in the same step.
//   - All keys are built by broker/api/redisschema under one prefix and the
//     hash tag {gpubroker}, so every multi-key script runs on one Cluster
//     slot; the table of key, type, TTL and owner is there.
//   - Scripts check nothing they do not need to: requests are validated in
//     Go first (fleet.ErrInvalid) and every script reply is type-checked.
//
// # Time
//
// Record times (CreatedAt, UpdatedAt), event times and the reconcile
// marker's value come from the injected clock (WithClock, default
// time.Now), passed to scripts through ARGV; scripts never read Redis's
// TIME. Redis TTLs (DefaultRetention, 7 days, for terminal server
// records and idle event streams) only collect garbage; no decision depends
// on them. Per-operation deadlines (DefaultOpTimeout, 2 s) are
// context timeouts, which reach the socket only if the client was built
// with ContextTimeoutEnabled.
//
// # Cost
//
// A placement script's Redis CPU is mostly Lua's own work, not the
// redis.calls: on the shared test machine (Redis 7.0) one redis.call costs
// 0.4-0.7 µs, but place.lua's body costs about 65 of them and release.lua's
// about 50 (BenchmarkPlaceReleaseScript), because every string made, number
// parsed or formatted, table and closure costs a few hundred ns there: the
// quota caps, the candidate's counters and the record's text (the usage
// counters are binary for this, keys.go's usageFormat: their decimal parse
// and format were a tenth of each operation; a device's three counters are
// one binary field of the same format, use, which took 7-9 % off a place
// and a release next to three decimal fields). Each argument, too, is a
// Lua string made per call (about 0.2 µs). A trivial EVALSHA costs 5-9 µs,
// mostly network I/O (BenchmarkPlaceRelease). So the scripts do only what
// they need: place.lua
// reads the candidate's counters, ref and the one index key the walk's
// scope does not give (four fields, not the whole record), the full-class
// index keys only when a device moves into that class, and the caps only
// of the resources that have one; release.lua reads memory, counters,
// health, kind and current-class indexes (six fields); the usage field
// prefixes and
// the mode list are constants in the scripts' text (libConsts), and the
// mode sets that only a capacity refusal counts are built in the script
// rather than passed on every call (go tool task bench prints both
// benchmarks).
//
// Places, and separately releases, are sent by group commit (batch.go,
// scripts/batch.lua): one that finds fewer than four batches of its kind in
// flight goes out at once, alone (as place.lua or release.lua itself);
// those that arrive while four are out
// wait and go together, up to WithBatch (DefaultBatch, 16) per script. A
// lone caller waits for nothing; under load the round trip and the
// script's set-up are shared, and each operation is still checked and
// charged on its own, in arrival order, with its own reply (an operation
// that raises an error fails only itself). A batch sends the keys and
// arguments that every operation shares once (the marker, allocs and
// usage keys, the key prefixes), makes the scripts' helper functions once,
// and place.lua reads the reconcile marker once per batch: each argument
// is a Lua string Redis makes per call, each function a closure.
// BenchmarkPlaceRelease runs with batches of 1 and of DefaultBatch side by
// side.
//
// # Errors
//
// redis.Nil becomes fleet.ErrNotFound here; placement refusals are
// *fleet.QuotaError and *fleet.CapacityError; stale spawns and forbidden
// transitions wrap fleet.ErrConflict; bad input wraps fleet.ErrInvalid.
// Other errors are Redis or network failures, wrapped with the operation.
package redisstore
