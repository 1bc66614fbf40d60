package redisstore

import (
	"net/url"

	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
)

// Keys. Every Redis key of the broker is built here, as
// <prefix>{gpubroker}:<kind>:<id>, so that all keys of one Store share the
// hash tag {gpubroker} and every multi-key script runs on one Cluster slot.
// Scripts that reach keys they cannot list in KEYS up front (the GPU that a
// placement walk finds, the GPU of a released slice) build them from
// gpuPrefix, passed in ARGV; those keys are in the same slot too.
//
//	key                          type    TTL            owner / written by
//	-------------------------    ------  -------------  --------------------------------------
//	marker                       string  none           reconciler (MarkReconciled); its absence
//	                                                    blocks placement (ErrNotReady)
//	gpus                         set     none           RegisterGPU: every registered GPU uuid
//	gpu:<uuid>                   hash    none           RegisterGPU/SetGPUHealth (inventory) and
//	                                                    place/release/restore (usage counters)
//	idx:a:all / idx:a:m:<model>  zset    none           healthy GPUs with compute left (Σ < 100 %),
//	                                                    score = free MiB; placement walks these
//	idx:f:all / idx:f:m:<model>  zset    none           healthy GPUs with all compute taken,
//	                                                    score = free MiB (may be < 0)
//	allocs                       hash    none           place/restore/release: slice id → allocation JSON
//	usage                        hash    none           place/restore/release: per user and group the
//	                                                    fields u:<user>:s|m|c and g:<group>:s|m|c
//	                                                    (servers, MiB, compute percent in use),
//	                                                    deleted when the subject holds nothing
//	srv:<user>:<name>            hash    7 d once       servers: the record of one server; no TTL
//	                                     terminal       while its spawn is live
//	ev:<user>:<name>             stream  7 d, renewed   servers: lifecycle events, MAXLEN ~ 256
//	                                     on each write
//	usrv:<user>                  set     none           servers: names of a user's servers; members
//	                                                    whose record expired are removed by List
//	srvs                         set     none           servers: all srv: keys, cleaned like usrv:
//
// The keys shared with the node agents (agent:*) are built by
// agentstore.Keys under the same prefix and hash tag; see its table.
//
// GPU records have no TTL: they are inventory, refreshed by the agents, and a
// GPU that leaves the fleet is expected to be marked unhealthy. The index,
// allocation and counter keys are derived data: they are rebuilt from pods
// by the reconciler after a flush and never orphaned (counters are deleted at
// zero). User and server names are query-escaped where they are not the last
// component of a key, so "a:b"/"c" and "a"/"b:c" never collide.
type keys struct {
	p string // the configured prefix followed by the hash tag
}

// hashTag is the one hash tag of every key. It is the agent contract's
// (limiter/agent/agentstore), so the broker's keys and the keys it shares
// with the node agents (samples, node reports, desired and applied quotas)
// hash to one Cluster slot and the broker's scripts may touch both.
const hashTag = agentstore.HashTag

func newKeys(prefix string) keys { return keys{p: prefix + hashTag} }

func (k keys) marker() string         { return k.p + "marker" }
func (k keys) gpus() string           { return k.p + "gpus" }
func (k keys) gpuPrefix() string      { return k.p + "gpu:" }
func (k keys) gpu(uuid string) string { return k.gpuPrefix() + uuid }

// availIndex and fullIndex are the indexes of GPUs of one model; a GPU
// with model "" has its own (empty-named) model indexes. allAvail and
// allFull are the indexes of all GPUs. See scripts/lib.lua for membership.
func (k keys) availIndex(model string) string { return k.p + "idx:a:m:" + model }
func (k keys) fullIndex(model string) string  { return k.p + "idx:f:m:" + model }
func (k keys) allAvail() string               { return k.p + "idx:a:all" }
func (k keys) allFull() string                { return k.p + "idx:f:all" }

// scopeIndexes returns the avail and full indexes that a placement
// constrained to model ("" = any) uses.
func (k keys) scopeIndexes(model string) (avail, full string) {
	if model == "" {
		return k.allAvail(), k.allFull()
	}
	return k.availIndex(model), k.fullIndex(model)
}
func (k keys) allocs() string                 { return k.p + "allocs" }
func (k keys) usage() string                  { return k.p + "usage" }
func (k keys) serverPrefix() string           { return k.p + "srv:" }
func (k keys) eventsPrefix() string           { return k.p + "ev:" }
func (k keys) userServers(user string) string { return k.p + "usrv:" + user }
func (k keys) allServers() string             { return k.p + "srvs" }

// serverID is the escaped "<user>:<name>" suffix shared by a server's record
// and event stream keys.
func serverID(user, name string) string {
	return url.QueryEscape(user) + ":" + url.QueryEscape(name)
}

func (k keys) server(user, name string) string { return k.serverPrefix() + serverID(user, name) }
func (k keys) events(user, name string) string { return k.eventsPrefix() + serverID(user, name) }

// Field prefixes in the usage hash. A subject's fields are
// <prefix><name>:s, :m and :c; since the suffix is fixed, no two names
// share a field. release.lua builds them from these prefixes, passed in ARGV.
const (
	userFieldPrefix  = "u:"
	groupFieldPrefix = "g:"
)

func userUsage(user string) string   { return userFieldPrefix + user + ":" }
func groupUsage(group string) string { return groupFieldPrefix + group + ":" }
