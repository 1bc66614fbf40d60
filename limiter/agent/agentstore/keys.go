package agentstore

// HashTag is the one Redis Cluster hash tag of every gpubroker key, the
// broker's (redisstore) and the agent's: keys are <prefix>HashTag<rest>.
const HashTag = "{gpubroker}:"

// Keys builds every key of the agent contract under one prefix. The zero
// value uses the empty prefix. It is a value type, safe for concurrent use.
//
//	key                        type     TTL                      written by
//	-------------------------  -------  -----------------------  ----------------------------------
//	agent:nodes                zset     none                     agent: node → last heartbeat, Unix ms
//	                                                             (broker may ZREM nodes gone for good)
//	agent:node:<node>          string   StaleAfter × heartbeat   agent: NodeReport JSON (heartbeat)
//	agent:s:<slice>            stream   SampleTTL, refreshed     agent: usage samples, MAXLEN ~ MaxLen
//	agent:qd:<slice>           hash     QuotaTTL                 broker: desired quota; field gen by HINCRBY
//	agent:qa:<slice>           hash     QuotaTTL, refreshed      agent: applied quota generation
//	agent:audit                stream   none (MAXLEN ~ 10000)    agent: enforcement audit records; the broker
//	                                                             follows it with a consumer group (FollowAudit)
//	agent:quota-changed        channel  —                        broker publishes a slice id after
//	                                                             changing its desired quota
//
// Slice ids and node names are the last component of their keys, so no
// escaping is needed for them to be unambiguous.
type Keys struct {
	p string
}

// NewKeys returns the key builder for prefix (may be ""; must not contain
// '{' or '}', like redisstore's prefix).
func NewKeys(prefix string) Keys { return Keys{p: prefix + HashTag + "agent:"} }

// Nodes is the sorted set of nodes by last heartbeat time (Unix ms).
func (k Keys) Nodes() string { return k.p + "nodes" }

// Node is the node report of node (string, JSON NodeReport).
func (k Keys) Node(node string) string { return k.p + "node:" + node }

// Samples is the usage sample stream of slice.
func (k Keys) Samples(slice string) string { return k.p + "s:" + slice }

// DesiredQuota is the desired quota hash of slice, written by the broker.
func (k Keys) DesiredQuota(slice string) string { return k.p + "qd:" + slice }

// AppliedQuota is the applied quota hash of slice, written by the agent.
func (k Keys) AppliedQuota(slice string) string { return k.p + "qa:" + slice }

// Audit is the stream of the agents' enforcement audit records.
func (k Keys) Audit() string { return k.p + "audit" }

// QuotaChanged is the pub/sub channel on which the broker publishes the id
// of a slice whose desired quota changed.
func (k Keys) QuotaChanged() string { return k.p + "quota-changed" }
