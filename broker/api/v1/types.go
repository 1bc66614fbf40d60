package v1

import (
	"fmt"
	"time"
)

// Slice is a share of one GPU held by one server.
type Slice struct {
	// MemoryMiB is the hard device-memory cap in MiB (1 MiB = 2^20 bytes); > 0.
	MemoryMiB int64 `json:"memoryMiB"`
	// ComputePercent is the guaranteed share of the GPU's SMs, 1..100.
	ComputePercent int `json:"computePercent"`
	// ComputeLimitPercent is the burst ceiling, ComputePercent..100.
	ComputeLimitPercent int `json:"computeLimitPercent"`
}

// SharingMode is how a server shares its GPU, and the one mode a GPU is in
// at a time (ARCHITECTURE.md, "Sharing mode").
type SharingMode string

// The sharing modes.
const (
	// SharingSliced is time division: a memory cap and a paced compute
	// share enforced by the in-pod limiter; elastic (resizable while it
	// runs). The default.
	SharingSliced SharingMode = "sliced"
	// SharingExclusive is a whole GPU held by one server.
	SharingExclusive SharingMode = "exclusive"
	// SharingMIG is one MIG instance (a hardware partition of a GPU in MIG
	// mode) of a named MIG profile, held whole by one server.
	SharingMIG SharingMode = "mig"
	// SharingMPS is space division through NVIDIA MPS: an MPS client with a
	// pinned device-memory limit and an active-thread percentage.
	SharingMPS SharingMode = "mps"
)

// SharingModes lists every sharing mode, default first.
var SharingModes = []SharingMode{SharingSliced, SharingExclusive, SharingMIG, SharingMPS}

// Valid reports whether m is one of SharingModes.
func (m SharingMode) Valid() bool {
	switch m {
	case SharingSliced, SharingExclusive, SharingMIG, SharingMPS:
		return true
	}
	return false
}

// Words names m for people: "time-sliced slice", "whole GPU", "MIG
// instance", "MPS client"; "" for an invalid mode.
func (m SharingMode) Words() string {
	switch m {
	case SharingSliced:
		return "time-sliced slice"
	case SharingExclusive:
		return "whole GPU"
	case SharingMIG:
		return "MIG instance"
	case SharingMPS:
		return "MPS client"
	}
	return ""
}

// ServerState is a step of the server lifecycle:
// pending → placing → creating → starting → running → stopping → stopped,
// with failed reachable from every state before running.
type ServerState string

// The server lifecycle states.
const (
	StatePending  ServerState = "pending"
	StatePlacing  ServerState = "placing"
	StateCreating ServerState = "creating"
	StateStarting ServerState = "starting"
	StateRunning  ServerState = "running"
	StateStopping ServerState = "stopping"
	StateStopped  ServerState = "stopped"
	StateFailed   ServerState = "failed"
)

// GPURef names the GPU a slice was placed on: for a MIG server, the MIG
// instance (UUID "MIG-…", MIGProfile set, ParentUUID its GPU).
type GPURef struct {
	UUID       string `json:"uuid"`
	Node       string `json:"node"`
	Model      string `json:"model"`
	MIGProfile string `json:"migProfile,omitempty"`
	ParentUUID string `json:"parentUuid,omitempty"`
}

// ResizeInfo says whether a server's slice can change while it runs, and
// if not, why and which profiles a restart could use instead.
type ResizeInfo struct {
	// Supported is true for time-sliced servers (PATCH .../slice).
	Supported bool `json:"supported"`
	// Reason says in words why not; "" when Supported.
	Reason string `json:"reason,omitempty"`
	// RestartProfiles are the profiles of the same sharing mode, offered to
	// the server's user, that a restart could use instead ("restart with
	// profile X"): stop the server and create it again with one of them.
	RestartProfiles []string `json:"restartProfiles,omitempty"`
}

// Server is one user's notebook server, as the API reports it.
type Server struct {
	User    string      `json:"user"`
	Name    string      `json:"name"` // "" is the user's default server
	Profile string      `json:"profile"`
	SpawnID string      `json:"spawnId"` // changes on every start; also the slice id
	State   ServerState `json:"state"`
	// Message is a readable sentence about the current state.
	Message string `json:"message"`
	Slice   Slice  `json:"slice"`
	// Sharing is the sharing mode of the server's profile; Resize says
	// whether its slice can change while it runs.
	Sharing SharingMode `json:"sharing"`
	Resize  ResizeInfo  `json:"resize"`
	GPU     *GPURef     `json:"gpu,omitempty"` // nil until placed
	// Guarantee is promised vs delivered over the last hour, from the node
	// agent's latest sample; nil when unknown (not running, no fresh
	// sample, or a whole-device server).
	Guarantee *Guarantee `json:"guarantee,omitempty"`
	// URL is the notebook's in-cluster address (http://podIP:port), set when running.
	URL string `json:"url,omitempty"`
	// OpenURL is the browser's address of the notebook through the
	// broker's proxy (<public URL>/user/<user slug>/<server slug>/), set
	// when the broker serves notebooks: the notebook itself while it runs,
	// else a page that says it is stopped or follows its start.
	OpenURL   string    `json:"openUrl,omitempty"`
	Pod       string    `json:"pod,omitempty"`
	CreatedAt time.Time `json:"createdAt"`
	UpdatedAt time.Time `json:"updatedAt"`
}

// Guarantee is promised vs delivered for one server (a sliced or MPS
// slice) over the node agent's window: of the time in which the server had
// work waiting (the in-pod limiter throttled it, or it launched kernels
// continuously), the time it received its guaranteed share of the SMs
// (at least 90 % of it, as NVML measures). For a GPU (GPUStatus) it is the
// tenant that fared worst.
type Guarantee struct {
	// Percent is the guaranteed compute, percent of the GPU's SMs.
	Percent int `json:"percent"`
	// WindowSeconds is the span the figures cover (3600: the last hour).
	WindowSeconds int64 `json:"windowSeconds"`
	// WantedSeconds is the time the server asked for its guarantee, and
	// MetSeconds of that the time it got it; both within the window.
	WantedSeconds int64 `json:"wantedSeconds"`
	MetSeconds    int64 `json:"metSeconds"`
	// Slice is, for a GPU, the worst tenant's slice (spawn id), and
	// Tenants the number of its tenants that asked in the window.
	Slice   string `json:"slice,omitempty"`
	Tenants int    `json:"tenants,omitempty"`
}

// Ratio is MetSeconds over WantedSeconds, 0..1; 1 when nothing was asked.
func (g Guarantee) Ratio() float64 {
	if g.WantedSeconds <= 0 {
		return 1
	}
	return float64(g.MetSeconds) / float64(g.WantedSeconds)
}

// Words says g in a sentence: "got its 25 % guarantee 99.2 % of the time
// it asked for it over the last hour", or "has not asked for its 25 %
// guarantee over the last hour".
func (g Guarantee) Words() string {
	span := "the last hour"
	if g.WindowSeconds != 3600 && g.WindowSeconds > 0 {
		span = fmt.Sprintf("the last %d s", g.WindowSeconds)
	}
	if g.WantedSeconds <= 0 {
		return fmt.Sprintf("has not asked for its %d %% guarantee over %s", g.Percent, span)
	}
	return fmt.Sprintf("got its %d %% guarantee %.1f %% of the time it asked for it over %s", g.Percent, 100*g.Ratio(), span)
}

// ServerPage is the body of GET /api/v1/servers and GET
// /api/v1/users/{user}/servers: one page of servers ordered by user, then
// name.
type ServerPage struct {
	Servers []Server `json:"servers"`
	// Next is the cursor (?cursor=) of the following page; "" on the last.
	// It is opaque.
	Next string `json:"next,omitempty"`
}

// Quota is the body of GET /api/v1/users/{user}/quota: every cap that
// applies to the user and what is in use under it.
type Quota struct {
	User string `json:"user"`
	// Quotas are the user's own cap first, then those of the user's groups
	// that have one, by name.
	Quotas []QuotaUse `json:"quotas"`
}

// QuotaUse is one cap and its use.
type QuotaUse struct {
	// Scope is "user" or "group"; Name the user or group. A group's cap
	// is shared by all its members.
	Scope string `json:"scope"`
	Name  string `json:"name"`
	// Limit is the cap; a zero field is no limit.
	Limit QuotaAmounts `json:"limit"`
	// Used is what is held now (by all members, for a group).
	Used QuotaAmounts `json:"used"`
}

// QuotaAmounts are amounts of the three things a quota counts.
type QuotaAmounts struct {
	// Servers are running or starting servers.
	Servers int `json:"servers"`
	// MemoryMiB is slice memory, MiB.
	MemoryMiB int64 `json:"memoryMiB"`
	// ComputePercent is guaranteed compute, percent of one GPU.
	ComputePercent int `json:"computePercent"`
}

// CreateServerRequest is the body of PUT /api/v1/users/{user}/servers/{name}.
type CreateServerRequest struct {
	// Profile is the name of a profile the caller's groups allow.
	Profile string `json:"profile"`
	// Env is extra environment for the notebook. Values whose names look like
	// credentials (containing TOKEN, SECRET, PASSWORD or KEY) are treated as
	// SecretEnv.
	Env map[string]string `json:"env,omitempty"`
	// SecretEnv is environment stored in a Kubernetes Secret and referenced
	// from the pod; values never appear in the pod spec or in the API.
	SecretEnv map[string]string `json:"secretEnv,omitempty"`
	// Command and Args are the notebook container's command and arguments,
	// with Kubernetes' meaning: Command replaces the image's ENTRYPOINT,
	// Args its CMD; an empty or absent list keeps the image's. They are a
	// pair: a request that sets either replaces the profile's command as a
	// whole; the profile's is used only when the request sets neither (and
	// an explicit empty list keeps the image's own). JupyterHub
	// sends Args ["jupyterhub-singleuser", ...] and no Command, so the
	// image's entrypoint (tini in the Jupyter docker-stacks images) still
	// runs first. Together at most MaxCommandEntries entries of at most
	// MaxCommandEntryBytes each, none containing a NUL byte; Command[0] must
	// not be empty.
	Command []string `json:"command,omitempty"`
	Args    []string `json:"args,omitempty"`
}

// Limits of CreateServerRequest.Command and Args, checked at the API's edge.
const (
	// MaxCommandEntries bounds len(Command) + len(Args).
	MaxCommandEntries = 256
	// MaxCommandEntryBytes bounds each entry, in bytes of UTF-8.
	MaxCommandEntryBytes = 4096
)

// Event is one lifecycle transition of a server, as streamed over SSE.
type Event struct {
	// ID is the event's stream id, usable as Last-Event-ID.
	ID      string      `json:"id"`
	SpawnID string      `json:"spawnId"`
	State   ServerState `json:"state"`
	Message string      `json:"message"`
	Time    time.Time   `json:"time"`
}

// Profile is an admin-defined offer, as listed to users.
type Profile struct {
	Name        string `json:"name"`
	DisplayName string `json:"displayName"`
	Description string `json:"description,omitempty"`
	Image       string `json:"image"`
	// CPU and Memory are Kubernetes quantities ("2", "500m", "8Gi").
	CPU    string `json:"cpu"`
	Memory string `json:"memory"`
	// Slice is the GPU share. For exclusive and MIG profiles it is what one
	// device of the kind holds (the whole GPU or instance) and is fixed by
	// the device placed on; the server's own slice says what it got.
	Slice Slice `json:"slice"`
	// Sharing is the profile's sharing mode; SharingWords says it in words
	// ("MIG instance 3g.71gb", "time-sliced slice").
	Sharing      SharingMode `json:"sharing"`
	SharingWords string      `json:"sharingWords"`
	// MIGProfile is the MIG profile of a mig profile, e.g. "3g.71gb".
	MIGProfile string   `json:"migProfile,omitempty"`
	Groups     []string `json:"groups,omitempty"` // empty: everyone
}

// GPU is one device as registered for placement: a physical GPU, or a MIG
// instance of a GPU in MIG mode (UUID "MIG-…", ParentUUID and MIGProfile
// set), which placement treats as a device of its own.
type GPU struct {
	UUID      string `json:"uuid"`
	Node      string `json:"node"`
	Model     string `json:"model"`
	MemoryMiB int64  `json:"memoryMiB"`
	SMCount   int    `json:"smCount"`
	Healthy   bool   `json:"healthy"`
	// Mode is the device's sharing mode: as reported by a node agent, the
	// mode its node's label asks for ("" = no label; SharingMIG for a GPU
	// whose MIG mode is on and for its instances, a hardware fact); as
	// registered, the mode in force.
	Mode SharingMode `json:"mode,omitempty"`
	// PendingMode is a mode asked for (node label or admin) that waits for
	// the GPU to hold no server; "" when none waits. Registered GPUs only.
	PendingMode SharingMode `json:"pendingMode,omitempty"`
	// MIGProfile is a MIG instance's profile, e.g. "3g.71gb".
	MIGProfile string `json:"migProfile,omitempty"`
	// ParentUUID is a MIG instance's GPU.
	ParentUUID string `json:"parentUuid,omitempty"`
	// ComputePercent is, for a MIG instance, its SMs as a percent of its
	// GPU's (1..100): what a server holding it is charged against compute
	// quotas. 0 for a physical GPU (a whole GPU is 100).
	ComputePercent int `json:"computePercent,omitempty"`
}

// Error is the body of every 4xx and 5xx answer.
type Error struct {
	// Code is a stable machine-readable word (see the Code* constants).
	Code string `json:"code"`
	// Message is a sentence a person understands.
	Message string `json:"message"`
	// Fields lists each invalid field of the request body, when the broker
	// can tell (400 only); Message then sums them up.
	Fields []FieldProblem `json:"fields,omitempty"`
	// Limit is the limit a refusal hit, in the API's units, on
	// quota_exceeded and no_capacity answers and on a resize refused
	// because the notebook holds more memory; Message says the same in
	// words.
	Limit *Limit `json:"limit,omitempty"`
}

// Limit is what a refused request ran into.
type Limit struct {
	// Kind is LimitQuota (a user's or group's cap), LimitGPU (the room on
	// the GPU with the most of it) or LimitInUse (the device memory the
	// notebook holds now).
	Kind string `json:"kind"`
	// Scope and Name say whose quota (kind quota): "user" or "group" and
	// its name. For kind gpu, Name is the node of that GPU, and Scope is
	// LimitScopeServer when it is the GPU the server holds (a resize), ""
	// for the GPU with the most room (a placement).
	Scope string `json:"scope,omitempty"`
	Name  string `json:"name,omitempty"`
	// Resource is what ran short: "servers", "memoryMiB" or
	// "computePercent".
	Resource string `json:"resource"`
	// Limit is the cap (quota), what is free on the GPU (gpu) or the
	// memory in use, the floor of a shrink (in-use); in Resource's unit.
	Limit int64 `json:"limit"`
	// Used is what is in use under the cap (quota only).
	Used int64 `json:"used,omitempty"`
	// Want is what the request asked for: the growth (quota), the slice's
	// amount (gpu) or the memory cap asked (in-use).
	Want int64 `json:"want"`
}

// The kinds of Limit, and the scope of a gpu limit on the server's own GPU.
const (
	LimitQuota       = "quota"
	LimitGPU         = "gpu"
	LimitInUse       = "in-use"
	LimitScopeServer = "server"
)

// Error codes.
const (
	CodeBadRequest       = "bad_request"
	CodeUnauthorized     = "unauthorized"
	CodeForbidden        = "forbidden"
	CodeNotFound         = "not_found"
	CodeMethodNotAllowed = "method_not_allowed"
	// CodePayloadTooLarge: the request body is over the broker's limit (413).
	CodePayloadTooLarge = "payload_too_large"
	// CodeUnsupportedMediaType: a request body that is not
	// application/json (415).
	CodeUnsupportedMediaType = "unsupported_media_type"
	CodeConflict             = "conflict"
	CodeNoCapacity           = "no_capacity"
	CodeQuotaExceeded        = "quota_exceeded"
	CodeUnavailable          = "unavailable"
	CodeInternal             = "internal"
)
