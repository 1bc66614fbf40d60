package v1

import "time"

// Slice is a share of one GPU held by one server.
type Slice struct {
	// MemoryMiB is the hard device-memory cap in MiB (1 MiB = 2^20 bytes); > 0.
	MemoryMiB int64 `json:"memoryMiB"`
	// ComputePercent is the guaranteed share of the GPU's SMs, 1..100.
	ComputePercent int `json:"computePercent"`
	// ComputeLimitPercent is the burst ceiling, ComputePercent..100.
	ComputeLimitPercent int `json:"computeLimitPercent"`
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

// GPURef names the GPU a slice was placed on.
type GPURef struct {
	UUID  string `json:"uuid"`
	Node  string `json:"node"`
	Model string `json:"model"`
}

// Server is one user's notebook server, as the API reports it.
type Server struct {
	User    string      `json:"user"`
	Name    string      `json:"name"` // "" is the user's default server
	Profile string      `json:"profile"`
	SpawnID string      `json:"spawnId"` // changes on every start; also the slice id
	State   ServerState `json:"state"`
	// Message is a readable sentence about the current state.
	Message string  `json:"message"`
	Slice   Slice   `json:"slice"`
	GPU     *GPURef `json:"gpu,omitempty"` // nil until placed
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
	CPU    string   `json:"cpu"`
	Memory string   `json:"memory"`
	Slice  Slice    `json:"slice"`
	Groups []string `json:"groups,omitempty"` // empty: everyone
}

// GPU is one physical device as registered for placement.
type GPU struct {
	UUID      string `json:"uuid"`
	Node      string `json:"node"`
	Model     string `json:"model"`
	MemoryMiB int64  `json:"memoryMiB"`
	SMCount   int    `json:"smCount"`
	Healthy   bool   `json:"healthy"`
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
