// Package redisschema is gpubroker's Redis schema: every key that the
// broker and the node agents use is built here, under one configurable
// prefix and one hash tag, and keys.go holds the table of key, type, TTL
// and owner.
//
// # Why a public package of its own
//
// Two programs share one Redis: the broker (broker/internal/redisstore,
// the web login's sessions) and gpubroker-agent on every GPU node
// (limiter/agent/agentstore). The agent may not import broker/internal,
// and the keys it shares with the broker (samples, node reports, desired
// and applied quotas) are the same strings on both sides; a key built in
// two places drifts. The agent's package cannot own the schema either,
// because most keys (placement, servers, sessions, the reclaim policy, the
// audit log) are the broker's and mean nothing to an agent. So the schema
// is a contract of its own, next to the REST API's (broker/api/v1): public,
// standard library only, no Redis client, importable by both programs.
// It holds names only; how each record is encoded stays with the code that
// reads and writes it (redisstore, agentstore, auth).
//
// # Invariants
//
//   - Every key is <prefix>{gpubroker}:<area>:<kind>[:<id>]: one hash tag
//     for every key, so every multi-key Lua script (placement, resize, the
//     policy save) runs on one Redis Cluster slot and may touch any key.
//     The prefix must not contain '{' or '}' (they would move the hash tag).
//   - Ids that are not the last component of a key are escaped (server
//     keys query-escape user and server names), so no two ids share a key.
//     Session and login keys hold the SHA-256 of the cookie value or state,
//     never the value, so a copy of the key space hands out no session.
//   - Every key that can be orphaned has a TTL (see the table); keys without
//     one are singletons, bounded sets or derived data that the reconciler
//     rebuilds from pods.
//
// Keys is a value type, safe for concurrent use; its zero value builds
// keys under the empty prefix.
package redisschema
