package v1

// HeaderGroups carries a user's groups, comma-separated, when the JupyterHub
// service token (or an admin) acts for that user; other callers' groups come
// from their own token.
const HeaderGroups = "X-Gpubroker-Groups"

// HeaderMode is set on every answer of a broker in dev mode, with the value
// ModeDevSimulated, so no client mistakes a simulated broker for a real one.
const HeaderMode = "X-Gpubroker-Mode"

// ModeDevSimulated is HeaderMode's value, and Info.Mode, in dev mode, where
// the cluster and the GPUs are simulated; Info.Mode is ModeProduction
// otherwise.
const (
	ModeDevSimulated = "dev-simulated"
	ModeProduction   = "production"
)

// Info is the body of GET /api/v1/.
type Info struct {
	Service    string `json:"service"`    // always "gpubroker"
	Version    string `json:"version"`    // the broker's build version
	APIVersion string `json:"apiVersion"` // always "v1"
	// Mode is "production" or "dev-simulated".
	Mode string `json:"mode"`
	// Notice says in words that the cluster and GPUs are simulated; dev mode only.
	Notice  string `json:"notice,omitempty"`
	OpenAPI string `json:"openapi"` // path of the OpenAPI document
}

// Me is the body of GET /api/v1/me.
type Me struct {
	User   string   `json:"user"`
	Groups []string `json:"groups"`
	Admin  bool     `json:"admin"`
	Hub    bool     `json:"hub"` // the JupyterHub service token
	Notice string   `json:"notice,omitempty"`
}

// GPUStatus is one GPU in GET /api/v1/admin/gpus: the registered device
// and what is allocated on it.
type GPUStatus struct {
	GPU
	// AllocatedMemoryMiB is Σ slice memory placed on the GPU, MiB.
	AllocatedMemoryMiB int64 `json:"allocatedMemoryMiB"`
	// AllocatedComputePercent is Σ guaranteed compute placed on the GPU, 0..100.
	AllocatedComputePercent int `json:"allocatedComputePercent"`
	// Slices is the number of slices placed on the GPU.
	Slices int `json:"slices"`
	// Guarantee is how its tenants fared (its worst tenant's Guarantee)
	// over the last hour, from its node agent's report; nil when no tenant
	// asked or the node does not report.
	Guarantee *Guarantee `json:"guarantee,omitempty"`
}

// Health is the body of GET /healthz.
type Health struct {
	Status string `json:"status"` // always "ok"
}

// Readiness is the body of GET /readyz.
type Readiness struct {
	Status string  `json:"status"` // "ready" or "not ready"
	Checks []Check `json:"checks"`
}

// Check is the result of one readiness check.
type Check struct {
	Name       string `json:"name"`
	OK         bool   `json:"ok"`
	Error      string `json:"error,omitempty"`
	DurationMS int64  `json:"durationMs"`
}
