// Package agentstore is the Redis contract between gpubroker-agent (one per
// GPU node) and the broker: node reports with a heartbeat, per-slice usage
// samples, desired and applied quotas, and the agent's audit records. Both
// sides use this package, so both sides encode and decode the same records.
//
// # Why a public package here
//
// The broker's Redis code lives in broker/internal/redisstore, which the
// agent may not import (limiter/* shares only the contract packages
// broker/api/v1 and broker/api/redisschema with the broker), and those are
// std-only, so they cannot hold Redis code. The agent owns most of these
// records (it writes samples, reports, applied quotas and audit records;
// the broker only writes desired quotas), so the record code lives next to
// the agent, in limiter/agent/agentstore, and the broker imports it.
//
// # Keys
//
// Every key is built by broker/api/redisschema (Keys.Samples,
// DesiredQuota, AppliedQuota, AgentNodes, AgentNode, AgentAudit,
// QuotaChanged): <prefix>{gpubroker}:agent:<kind>[:<id>], under the same
// prefix and hash tag as the broker's own keys; the table of key, type,
// TTL and writer is there.
//
// # Invariants
//
//   - Samples are bounded: each slice's stream is trimmed to about
//     MaxLen entries on every write (XADD MAXLEN ~; at most one listpack
//     node, 100 entries, more), and a stream that stops receiving samples
//     expires after SampleTTL. With the default MaxLen of 3600 (1 h at
//     1 Hz), 24 h of samples leave ~3,600 entries and ~196 KB per slice
//     (measured with complete samples); the tests assert at most 384 KiB.
//   - Missing data is recorded as missing, never as zero: a Sample field
//     that NVML could not provide is stored empty ("") in the stream entry and nil in
//     the decoded Sample, with the reason in Sample.Missing.
//   - Staleness is decided by the reader from the sample's own time and
//     interval against the reader's clock (Sample.Stale): a sample older than
//     StaleAfter intervals is stale, so an agent that stops is noticed within
//     three intervals even though its last sample is still stored.
//   - A node report expires StaleAfter heartbeat intervals after its last
//     write; a node listed in the node index without a report is stale
//     ("unknown", ARCHITECTURE.md invariant 4), never healthy.
//   - Desired quota generations are assigned by Redis (HINCRBY) so they grow
//     monotonically across broker replicas; the agent records the generation
//     it applied, so the broker can tell when a resize took effect.
//
// # Who calls what
//
// The agent: Heartbeat, AddSamples, DesiredQuota, WatchQuotaChanges,
// SetAppliedQuota, AddAudit. The broker: SyncInventory (every few seconds:
// registers reported GPUs, marks GPUs of stale nodes unhealthy), Nodes (the
// reason a GPU is unhealthy, to tell the servers on it), LatestSample and
// RecentSamples (resize, usage charts), RecentSamplesBatch and
// Sample.FreshUntil (idle detection: one pipelined read of every running
// slice per cycle; stale means unknown),
// SetDesiredQuota and AppliedQuota (resize, reclaim), DeleteQuotas (on
// release), AuditBefore (the admin audit view, merged with the broker's
// own log), FollowAudit (each record once per consumer group across the
// replicas: the servers' enforcement events).
//
// # Time
//
// Record times come from the writer's injected clock and are stored as
// Unix milliseconds; Redis's clock is never read. TTLs only collect garbage.
//
// A Store is safe for concurrent use. The caller owns the Redis client; build
// it with ContextTimeoutEnabled so per-operation deadlines reach the socket.
package agentstore
