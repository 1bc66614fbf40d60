package fleet

import (
	"slices"
	"time"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

// State is a server lifecycle state; see v1.ServerState.
type State = v1.ServerState

// Terminal reports whether s ends a spawn (stopped or failed): a new start is
// allowed from it.
func Terminal(s State) bool { return s == v1.StateStopped || s == v1.StateFailed }

// ServerKey identifies a server: one user's named notebook. Name "" is the
// user's default server.
type ServerKey struct {
	User string
	Name string
}

// Server is the stored record of one server and its current spawn.
type Server struct {
	ServerKey
	Profile        string
	SpawnID        string // new on every start; the slice id
	IdempotencyKey string // of the create that started this spawn
	// RequestDigest is a SHA-256 digest (hex) of the create request that
	// started this spawn, so that a same-key retry with another request is
	// told apart from a real retry; "" for records made before it existed
	// or rebuilt from pods (then only the profile is compared).
	RequestDigest string
	State         State
	Message       string
	// Slice is the profile's slice until placed, then the allocation's
	// (for exclusive and mig servers, the size of the device they hold).
	Slice Slice
	// Sharing and MIGProfile are the profile's sharing mode and MIG
	// profile; Sharing "" reads as SharingSliced (records made before).
	Sharing    SharingMode
	MIGProfile string
	Allocation *Allocation // nil until placed
	Pod        string
	URL        string
	CreatedAt  time.Time
	UpdatedAt  time.Time
}

// Event is one transition of a server, appended to its event stream.
type Event = v1.Event

// Profile is an admin-defined offer.
type Profile struct {
	Name        string
	DisplayName string
	Description string
	Image       string
	CPU         string // Kubernetes quantity, e.g. "2"
	Memory      string // Kubernetes quantity, e.g. "8Gi"
	// Slice is the share of a sliced or mps profile; zero for exclusive
	// and mig, whose device is held whole.
	Slice Slice
	// Sharing is the profile's sharing mode; "" reads as SharingSliced.
	Sharing SharingMode
	// MIGProfile is the MIG profile of a mig profile, e.g. "3g.71gb".
	MIGProfile string
	// Model restricts placement to one GPU model; "" means any.
	Model string
	// Groups that may use the profile; empty means everyone.
	Groups []string
	// Command and Args start the notebook when a create request sets
	// neither (Kubernetes meaning: Command replaces the image's ENTRYPOINT,
	// Args its CMD; nil keeps the image's). They may use $(GPUBROKER_BASE_URL)
	// and $(GPUBROKER_POD_IP); the notebook token reaches the notebook as
	// JUPYTER_TOKEN from the server's Secret.
	Command, Args []string
}

// Words names p's sharing in words (SharingWords).
func (p Profile) Words() string { return SharingWords(p.Sharing, p.MIGProfile) }

// Allows reports whether a member of groups may use p.
func (p Profile) Allows(groups []string) bool {
	if len(p.Groups) == 0 {
		return true
	}
	return slices.ContainsFunc(groups, func(g string) bool { return slices.Contains(p.Groups, g) })
}

// ServerPatch lists the fields a transition may set besides state and
// message; nil fields are left as they are. Setting Allocation sets the
// record's Slice to the allocation's too.
type ServerPatch struct {
	Allocation *Allocation
	Pod        *string
	URL        *string
	// DropAllocation clears the record's allocation (the slice was
	// released): a stopped or failed server holds no GPU. It wins over
	// Allocation.
	DropAllocation bool
	// ForgetIdempotencyKey clears the record's idempotency key: the create
	// that started the spawn did not succeed, so a retry with the key must
	// start anew (ARCHITECTURE.md invariant 8).
	ForgetIdempotencyKey bool
}

// QuotaUse is one cap that applies to a user and what is in use under it.
type QuotaUse struct {
	// Scope is "user" or "group"; Name the user or group.
	Scope, Name string
	// Limit is the cap (a zero field: unlimited); Used what the user (or
	// all members of the group) hold now.
	Limit, Used Quota
}

// ResizeResult is the outcome of an accepted resize (servers.Service.Resize).
type ResizeResult struct {
	// Server is the record after the resize.
	Server Server
	// Slice is the slice the server now holds.
	Slice Slice
	// Generation is the desired-quota generation that carries Slice to the
	// node agent (the agent contract's desired quota), >= 1.
	Generation int64
	// Applied is true when the agent acknowledged Generation (the quota
	// file holds it; the in-pod hook follows within 100 ms) before Resize
	// answered.
	Applied bool
	// Deadline is, when not Applied, the time by which the agent is
	// expected to apply Generation (service clock); zero when Applied.
	Deadline time.Time
}

// ProxyActivity is what the broker's notebook proxy saw of one spawn: the
// time of the last request it forwarded and the WebSockets (kernel channels,
// terminals) open through it. It is one activity signal among others for
// the reclaimer; its absence means "not used through the broker", never
// "idle" (ARCHITECTURE.md invariant 4).
type ProxyActivity struct {
	// LastRequest is when the last proxied request of the spawn began (UTC);
	// zero when none was seen.
	LastRequest time.Time
	// OpenWebSockets is the number of WebSockets open through the proxy now,
	// summed over the broker replicas that reported recently.
	OpenWebSockets int
}
