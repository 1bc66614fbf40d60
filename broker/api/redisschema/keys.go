package redisschema

import (
	"crypto/sha256"
	"encoding/hex"
	"net/url"
)

// HashTag is the one Redis Cluster hash tag of every gpubroker key.
const HashTag = "{gpubroker}"

// Keys builds every key under one prefix. The table lists each key after
// <prefix>{gpubroker}: with its type, its TTL and who writes it.
//
//	key                              type    TTL                    owner (writer)
//	-------------------------------  ------  ---------------------  ------------------------------------------
//	Placement (broker/internal/redisstore; rebuilt from pods by the reconciler after a flush)
//	marker                           string  none                   reconciler (MarkReconciled); its absence
//	                                                                blocks placement (ErrNotReady)
//	marker:epoch                     string  none                   reconciler (ReconcileEpoch): "<unix ns>-<random>" token
//	                                                                a pass reads first; marking checks it, so
//	                                                                a pass that began before a flush cannot
//	                                                                mark the flushed data rebuilt
//	gpus                             set     none                   RegisterGPU: every registered GPU uuid
//	gpu:<uuid>                       hash    none                   RegisterGPU/SetGPUHealth/SetGPUMode
//	                                                                (inventory, mode) and place/release/
//	                                                                restore (usage counters); a GPU or a
//	                                                                MIG instance ("MIG-…"); its counters are
//	                                                                16 bytes in field use: allocations int32,
//	                                                                MiB int64, compute % int32, little-endian
//	                                                                (earlier builds' decimal fields amem acp
//	                                                                n are read, then set to "use": no number)
//	idx:<pool>:a:all                 zset    none                   healthy devices of a pool (Pool: a sharing
//	idx:<pool>:a:m:<model>                                          mode, or mig:<MIG profile>) with room,
//	                                                                score = free MiB; placement walks these
//	idx:<pool>:f:all                 zset    none                   healthy devices of a pool that are full
//	idx:<pool>:f:m:<model>
//	mode:<mode>                      set     none                   register/SetGPUMode: the physical GPUs in
//	                                                                each sharing mode (MIG instances in none)
//	allocs                           hash    none                   place/restore/release: slice id → JSON
//	usage                            hash    none                   place/restore/release: one field per user
//	                                                                (u:<user>) and group (g:<group>), value
//	                                                                16 bytes in use: servers int32, MiB int64,
//	                                                                compute % int32, little-endian (earlier
//	                                                                builds' "<servers> <MiB> <%>" text is
//	                                                                read and rewritten); deleted at zero
//	                                                                servers
//	Servers (broker/internal/redisstore; restored from pods by the reconciler)
//	srv:<user>:<name>                hash    retention once         the server record; no TTL while its
//	                                         terminal (7 d)         spawn is live
//	srvprev:<user>:<name>            hash    10 min                 a start's create moves the stopped or
//	                                                                failed record here; a refused start
//	                                                                moves it back (nothing left behind)
//	ev:<user>:<name>                 stream  retention, renewed     lifecycle events, MAXLEN ~ 256
//	usrv:<user>                      set     none                   names of a user's servers (expired
//	                                                                members are removed on List)
//	srvs                             set     none                   every srv: key, cleaned like usrv:
//	Web login (broker/internal/auth through redisstore; lost sessions mean a new sign-in)
//	web:<sha256(state)>:login        string  10 min                 /auth/login writes, the callback GETDELs
//	web:<sha256(id)>:session         string  the session's TTL      callback writes, refresh rewrites
//	                                                                (KEEPTTL), logout DELs
//	web:<sha256(id)>:refresh         string  15 s                   lock of the replica refreshing a session
//	Notebook proxy (broker/internal/redisstore.Notebooks for broker/internal/proxy; lost: a new hand-off)
//	nb:<sha256(code)>:handoff        string  HandoffTTL (1 min)     host mode's one-time code: the broker's
//	                                                                origin writes, the notebook host GETDELs
//	nb:<sha256(id)>:host             string  the host session's     a notebook host's session (cookie id),
//	                                         TTL (≤ web session)    written when a code is redeemed
//	nb:act:<spawnID>                 hash    ActivityTTL (25 h),    per replica: "<last request ms> <open
//	                                         renewed                WebSockets> <written ms>"; the reclaimer reads
//	Reclaim (broker/internal/redisstore for broker/internal/reclaim; not rebuilt: a flush
//	restores the default policy and gives every spawn a fresh idle clock)
//	reclaim:policy                   string  none                   policy save: JSON of the current policy
//	reclaim:policy:version           string  none                   policy save: current version, integer
//	reclaim:policy:history           hash    none                   policy save: version → JSON, the last 100
//	reclaim:spawn:<spawnID>          hash    8 d, renewed           the reclaimer's idle state of one spawn;
//	                                                                the extend script owns its ext fields
//	audit                            stream  none (MAXLEN ~ 10000)  the broker's audit log: policy saves,
//	                                                                reclaim actions, extensions
//	Agent contract (limiter/agent/agentstore: written by the agents unless noted)
//	agent:nodes                      zset    none                   node → last heartbeat, Unix ms (the broker
//	                                                                may ZREM nodes gone for good)
//	agent:node:<node>                string  3 heartbeats           NodeReport JSON (the heartbeat)
//	agent:s:<slice>                  stream  SampleTTL, refreshed   usage samples, MAXLEN ~ MaxLen
//	agent:qd:<slice>                 hash    QuotaTTL               broker: desired quota; gen by HINCRBY
//	agent:qa:<slice>                 hash    QuotaTTL, refreshed    applied quota generation
//	agent:audit                      stream  none (MAXLEN ~ 10000)  enforcement audit records; the broker
//	                                                                follows it with the consumer group
//	                                                                broker-events (agentstore.FollowAudit)
//	agent:quota-changed              channel —                      broker publishes a slice id after
//	                                                                changing its desired quota
//	agent:modes:<node>               hash    1 min, rewritten       broker (agentstore.SetModes): gpu uuid →
//	                                                                sharing mode in force, for the agent
//
// Slice ids, spawn ids, GPU uuids, model names and node names are the last
// component of their keys, so they need no escaping to be unambiguous.
type Keys struct {
	p string // the prefix and the hash tag, ending in ':'
}

// New returns the key builder for prefix ("" allowed; no '{' or '}').
func New(prefix string) Keys { return Keys{p: prefix + HashTag + ":"} }

// ---- placement ----

// Marker is the reconcile marker (string, the time of the last rebuild).
func (k Keys) Marker() string { return k.p + "marker" }

// MarkerEpoch is the reconcile epoch token (string, random hex).
func (k Keys) MarkerEpoch() string { return k.p + "marker:epoch" }

// GPUs is the set of every registered GPU uuid.
func (k Keys) GPUs() string { return k.p + "gpus" }

// GPUPrefix is the prefix of the GPU records; scripts that find GPUs by
// walking an index build their keys from it (passed in ARGV).
func (k Keys) GPUPrefix() string { return k.p + "gpu:" }

// GPU is the record of the GPU uuid (hash).
func (k Keys) GPU(uuid string) string { return k.GPUPrefix() + uuid }

// Pool names the placement pool of a device: its sharing mode, or for a
// MIG instance "mig:<MIG profile>" (a MIG-mode GPU itself is in no pool,
// its instances are). mode "" is "sliced". A MIG profile never holds ':'
// (fleet.ValidateMIGProfile), so a pool is one key component.
func Pool(mode, migProfile string) string {
	switch {
	case mode == "":
		return "sliced"
	case mode == "mig":
		return "mig:" + migProfile
	}
	return mode
}

// IndexPrefix is the prefix of every placement index; scripts that move a
// device between pools build its index keys from it (passed in ARGV):
// <IndexPrefix><pool>:a:all, <pool>:a:m:<model>, and the same with f.
func (k Keys) IndexPrefix() string { return k.p + "idx:" }

// AvailIndex and FullIndex are the free-memory indexes of the healthy
// devices of one pool and one model with room and without (zsets); a
// device with model "" has its own (empty-named) model indexes.
func (k Keys) AvailIndex(pool, model string) string { return k.IndexPrefix() + pool + ":a:m:" + model }

// FullIndex: see AvailIndex.
func (k Keys) FullIndex(pool, model string) string { return k.IndexPrefix() + pool + ":f:m:" + model }

// AllAvail and AllFull are the indexes of a pool over all models.
func (k Keys) AllAvail(pool string) string { return k.IndexPrefix() + pool + ":a:all" }

// AllFull: see AllAvail.
func (k Keys) AllFull(pool string) string { return k.IndexPrefix() + pool + ":f:all" }

// ModePrefix is the prefix of the per-mode GPU sets (ModeGPUs), passed to
// scripts that change a GPU's mode.
func (k Keys) ModePrefix() string { return k.p + "mode:" }

// ModeGPUs is the set of the physical GPUs in sharing mode mode.
func (k Keys) ModeGPUs(mode string) string { return k.ModePrefix() + mode }

// Allocs is the hash of every placed slice (slice id → allocation JSON).
func (k Keys) Allocs() string { return k.p + "allocs" }

// Usage is the hash of the users' and groups' quota counters.
func (k Keys) Usage() string { return k.p + "usage" }

// ---- servers ----

// serverID is the escaped "<user>:<name>" suffix of a server's record and
// event stream keys, so "a:b"/"c" and "a"/"b:c" never collide.
func serverID(user, name string) string {
	return url.QueryEscape(user) + ":" + url.QueryEscape(name)
}

// Server is the record of one server (hash).
func (k Keys) Server(user, name string) string { return k.p + "srv:" + serverID(user, name) }

// ServerPrevious is where a new start keeps the stopped or failed record
// it replaces until the start has got past its refusable steps (hash).
func (k Keys) ServerPrevious(user, name string) string {
	return k.p + "srvprev:" + serverID(user, name)
}

// Events is the lifecycle event stream of one server.
func (k Keys) Events(user, name string) string { return k.p + "ev:" + serverID(user, name) }

// UserServers is the set of user's server names.
func (k Keys) UserServers(user string) string { return k.p + "usrv:" + user }

// AllServers is the set of every server record key.
func (k Keys) AllServers() string { return k.p + "srvs" }

// ---- web login ----

func digest(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// Login is the pending sign-in of the OAuth state value state (string).
func (k Keys) Login(state string) string { return k.p + "web:" + digest(state) + ":login" }

// Session is the web session of the cookie value id (string, JSON).
func (k Keys) Session(id string) string { return k.SessionByDigest(digest(id)) }

// SessionByDigest is the web session whose cookie value has the hex
// SHA-256 digest d: what a notebook host session keeps of the web session
// it came from, so it can tell when that one ends without holding it.
func (k Keys) SessionByDigest(d string) string { return k.p + "web:" + d + ":session" }

// ---- notebook proxy ----

// Handoff is host mode's one-time hand-off code (string).
func (k Keys) Handoff(code string) string { return k.p + "nb:" + digest(code) + ":handoff" }

// HostSession is a notebook host's session of the cookie value id (string).
func (k Keys) HostSession(id string) string { return k.p + "nb:" + digest(id) + ":host" }

// ProxyActivity is what the replicas' notebook proxies saw of one spawn
// (hash, field per replica).
func (k Keys) ProxyActivity(spawnID string) string { return k.p + "nb:act:" + spawnID }

// SessionRefresh is the lock of the replica refreshing session id's tokens.
func (k Keys) SessionRefresh(id string) string { return k.p + "web:" + digest(id) + ":refresh" }

// ---- reclaim ----

// ReclaimPolicy is the current reclaim policy (string, JSON).
func (k Keys) ReclaimPolicy() string { return k.p + "reclaim:policy" }

// ReclaimPolicyVersion is the current policy version (string, integer).
func (k Keys) ReclaimPolicyVersion() string { return k.p + "reclaim:policy:version" }

// ReclaimPolicyHistory is the hash of recent policy versions (version → JSON).
func (k Keys) ReclaimPolicyHistory() string { return k.p + "reclaim:policy:history" }

// IdleState is the reclaimer's idle state of one spawn (hash).
func (k Keys) IdleState(spawnID string) string { return k.p + "reclaim:spawn:" + spawnID }

// Audit is the broker's audit log (stream).
func (k Keys) Audit() string { return k.p + "audit" }

// ---- agent contract ----

// AgentNodes is the sorted set of nodes by last heartbeat (Unix ms).
func (k Keys) AgentNodes() string { return k.p + "agent:nodes" }

// AgentNode is the node report of node (string, JSON).
func (k Keys) AgentNode(node string) string { return k.p + "agent:node:" + node }

// Samples is the usage sample stream of slice.
func (k Keys) Samples(slice string) string { return k.p + "agent:s:" + slice }

// DesiredQuota is the desired quota hash of slice, written by the broker.
func (k Keys) DesiredQuota(slice string) string { return k.p + "agent:qd:" + slice }

// AppliedQuota is the applied quota hash of slice, written by the agent.
func (k Keys) AppliedQuota(slice string) string { return k.p + "agent:qa:" + slice }

// AgentAudit is the stream of the agents' enforcement audit records.
func (k Keys) AgentAudit() string { return k.p + "agent:audit" }

// AgentModes is the hash of the sharing modes in force on node's GPUs
// (gpu uuid → mode), written by the broker for the node's agent.
func (k Keys) AgentModes(node string) string { return k.p + "agent:modes:" + node }

// QuotaChanged is the pub/sub channel on which the broker publishes the id
// of a slice whose desired quota changed.
func (k Keys) QuotaChanged() string { return k.p + "agent:quota-changed" }
