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
}

// Error codes.
const (
	CodeBadRequest       = "bad_request"
	CodeUnauthorized     = "unauthorized"
	CodeForbidden        = "forbidden"
	CodeNotFound         = "not_found"
	CodeMethodNotAllowed = "method_not_allowed"
	CodeConflict         = "conflict"
	CodeNoCapacity       = "no_capacity"
	CodeQuotaExceeded    = "quota_exceeded"
	CodeUnavailable      = "unavailable"
	CodeInternal         = "internal"
)
