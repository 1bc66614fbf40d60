package httpapi

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/audit"
	"github.com/gpubroker/gpubroker/broker/internal/auth"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/internal/reclaim"
)

// Servers is the server lifecycle service (implemented by broker/internal/servers).
// Implementations must be safe for concurrent use. Errors are translated to
// HTTP answers by the error table in errors.go, so they should wrap the fleet
// sentinels (or be *fleet.CapacityError / *fleet.QuotaError) where a person
// can act on them.
type Servers interface {
	// Create starts server name of user with the profile in req for by,
	// checking quotas for user and groups. It returns the server and
	// whether this call created the spawn (false: an existing spawn with
	// the same idempotencyKey). idempotencyKey is "" when the caller sent
	// none. A refusal leaves no server behind.
	Create(ctx context.Context, by audit.Actor, user string, groups []string, name string, req v1.CreateServerRequest, idempotencyKey string) (fleet.Server, bool, error)
	// Get returns the server; fleet.ErrNotFound if there is no record.
	Get(ctx context.Context, key fleet.ServerKey) (fleet.Server, error)
	// ListPage returns up to limit servers of user (every user's when user
	// is ""), ordered by user and name, after cursor ("" = the first page),
	// and the next page's cursor ("" on the last); a bad cursor wraps
	// fleet.ErrInvalid.
	ListPage(ctx context.Context, user, cursor string, limit int) ([]fleet.Server, string, error)
	// Delete stops the server for by. It is idempotent and returns the
	// server as it is after the call (stopping or stopped; a failed server
	// stays failed with its reason); fleet.ErrNotFound if the server never
	// existed.
	Delete(ctx context.Context, by audit.Actor, key fleet.ServerKey) (fleet.Server, error)
	// Remove deletes a stopped or failed server's record for by; a
	// *fleet.StateError (fleet.ErrConflict) for a live one,
	// fleet.ErrNotFound for none.
	Remove(ctx context.Context, by audit.Actor, key fleet.ServerKey) error
	// Quota returns the caps that apply to user in groups with what is in
	// use under each: the user's own first, then the groups'.
	Quota(ctx context.Context, user string, groups []string) ([]fleet.QuotaUse, error)
	// Events returns the server's events strictly after afterID ("" = from
	// the start of the retained stream), in order. When there are none and
	// block > 0 it waits up to block for new ones and may return none.
	// A malformed afterID is an error wrapping fleet.ErrInvalid.
	Events(ctx context.Context, key fleet.ServerKey, afterID string, block time.Duration) ([]fleet.Event, error)
}

// Profiles lists the configured profiles.
type Profiles interface {
	// For returns the profiles a member of groups may use, in display order.
	For(groups []string) []fleet.Profile
}

// Fleet is the GPU inventory (implemented by *redisstore.Store).
type Fleet interface {
	// GPUs returns every registered GPU.
	GPUs(ctx context.Context) ([]fleet.GPU, error)
	// Allocations returns every placed slice.
	Allocations(ctx context.Context) ([]fleet.Allocation, error)
	// RegisterGPU adds or updates a GPU without touching its allocations.
	RegisterGPU(ctx context.Context, g fleet.GPU) error
	// SetGPUMode sets a GPU's sharing mode as an admin asks ("" = follow
	// its node's label); see redisstore.Store.SetGPUMode for the errors.
	SetGPUMode(ctx context.Context, uuid string, mode fleet.SharingMode) (fleet.GPU, error)
}

// Guarantees is promised vs delivered as the node agents report it
// (implemented in the composition root over agentstore). Optional.
type Guarantees interface {
	// GPUGuarantees returns, per GPU uuid, its worst tenant's figures from
	// fresh node reports.
	GPUGuarantees(ctx context.Context) (map[string]v1.Guarantee, error)
	// ServerGuarantee returns a running slice's figures from its latest
	// fresh sample; nil when unknown.
	ServerGuarantee(ctx context.Context, spawnID string) (*v1.Guarantee, error)
}

// Authenticator turns a request's credentials into a principal. It returns
// an error matching auth.ErrNoCredentials when the request carries none and
// one matching auth.ErrUnauthenticated (an *auth.Error with a readable
// Reason) when they are not valid.
type Authenticator interface {
	Authenticate(ctx context.Context, r *http.Request) (auth.Principal, error)
}

// Checker is one readiness check (Redis reachable, Kubernetes reachable, ...).
type Checker interface {
	// Name is a short stable word shown in /readyz, e.g. "redis".
	Name() string
	// Check returns nil when the dependency is usable. It must return soon
	// after ctx is done: /readyz waits for every check.
	Check(ctx context.Context) error
}

// Mode says whether the broker runs against a simulated cluster and GPUs.
type Mode struct {
	// Simulated marks dev mode: every answer carries the header
	// X-Gpubroker-Mode: dev-simulated, and GET /api/v1/ and /api/v1/me carry
	// Notice (default DefaultSimulatedNotice).
	Simulated bool
	Notice    string
}

// Deps are what the API needs. Servers, Profiles, Fleet, Auth and Log are
// required; the rest have defaults.
type Deps struct {
	// Servers is the server lifecycle service.
	Servers Servers
	// Profiles is the profile catalog.
	Profiles Profiles
	// Fleet is the GPU inventory, for the admin routes.
	Fleet Fleet
	// Auth authenticates every /api/v1 route except / and /openapi.yaml.
	Auth Authenticator
	// Resize serves PATCH .../servers/{name}/slice; nil: not served.
	Resize Resizer
	// Policy serves the reclaim policy routes; nil: not served.
	Policy Policy
	// Audit serves the audit log route; nil: not served.
	Audit Audit
	// Reclaim serves a server's idle state and extend routes; nil: not served.
	Reclaim Reclaim
	// Guarantees adds promised-vs-delivered figures to GET of a server and
	// of the GPUs; nil: they are absent.
	Guarantees Guarantees
	// Checkers run concurrently on GET /readyz; none means always ready.
	Checkers []Checker
	// Log receives one line per request, including every internal error.
	Log *slog.Logger
	// Version is the broker's version as shown by GET /api/v1/; default "dev".
	Version string
	// Mode is production (the zero value) or simulated.
	Mode Mode
	// Now is the clock; default time.Now.
	Now func() time.Time
	// Metrics receives a measurement per answered request and the open
	// event streams; nil: none.
	Metrics Metrics
	// OpenURL gives a server's browser address through the broker's
	// notebook proxy (v1.Server.OpenURL); nil when the broker serves no
	// notebooks.
	OpenURL func(user, name string) string
}

// Metrics receives the API's measurements (implemented by
// broker/internal/metrics). Its methods must be safe for concurrent use
// and must not block.
type Metrics interface {
	// ObserveRequest records one answered request: method, route template
	// ("" when no route matched), status code and time to answer; stream
	// is true for an event stream, whose duration is its client's.
	ObserveRequest(method, route string, code int, d time.Duration, stream bool)
	// StreamOpened and StreamClosed bracket each event stream.
	StreamOpened()
	StreamClosed()
}

// noMetrics discards measurements.
type noMetrics struct{}

func (noMetrics) ObserveRequest(string, string, int, time.Duration, bool) {}
func (noMetrics) StreamOpened()                                           {}
func (noMetrics) StreamClosed()                                           {}

// DefaultSimulatedNotice is the notice shown in dev mode when Deps.Notice is "".
const DefaultSimulatedNotice = "dev mode: the Kubernetes cluster and the GPUs are simulated"

// Policy is the reclaim policy (implemented by *reclaim.Policies). It is
// optional: without it the reclaim-policy routes are not served (404).
type Policy interface {
	// Get returns the current policy (reclaim.DefaultPolicy, version 0,
	// when none was saved).
	Get(ctx context.Context) (reclaim.Policy, error)
	// Put saves p if p.Version is the current version, as actor, and audits
	// it; *reclaim.ValidationError (fleet.ErrInvalid) or
	// *reclaim.ConflictError (fleet.ErrConflict) otherwise.
	Put(ctx context.Context, p reclaim.Policy, actor string) (reclaim.Policy, error)
}

// Audit is the audit log: the broker's and the node agents' entries in one
// view (implemented by *redisstore.AuditLog). It is
// optional: without it the audit route is not served (404).
type Audit interface {
	// Audit returns a page of audit entries, newest first, and the next
	// page's cursor.
	Audit(ctx context.Context, q audit.Query) ([]audit.Entry, string, error)
}

// Reclaim is the idle reclaimer's per-server side and its preview
// (implemented by *reclaim.Reclaimer). It is optional: without it the
// idle, extend and preview routes are not served (404). Safe for
// concurrent use.
type Reclaim interface {
	// State returns the idle state of srv's current spawn.
	State(ctx context.Context, srv fleet.Server) (reclaim.IdleState, error)
	// Extend postpones idle actions on srv by d for actor (the user, the
	// hub acting for them, or an admin); fleet.ErrInvalid
	// beyond the policy's limit (the message names what is left),
	// fleet.ErrConflict when srv is not running.
	Extend(ctx context.Context, srv fleet.Server, d time.Duration, actor audit.Actor) (reclaim.IdleState, error)
	// Preview returns what the next cycle would do to every running
	// server under pol (*reclaim.ValidationError for an invalid pol).
	Preview(ctx context.Context, pol reclaim.Policy) ([]reclaim.PreviewServer, error)
}
