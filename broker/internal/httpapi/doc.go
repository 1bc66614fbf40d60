// Package httpapi is the broker's REST API (/api/v1, labstack/echo v4): the
// routes, their middleware, the one table that turns errors into HTTP
// answers, and the OpenAPI document that describes exactly what is served.
//
// # Shape
//
// New(Deps, ...Option) returns an *echo.Echo. Deps holds small interfaces
// defined here, by the consumer (Servers, Profiles, Fleet, Authenticator,
// Checker); the composition root passes the concrete services. The package
// imports no concrete service, only broker/internal/auth for the Principal,
// its context accessors and its errors, and the fleet domain types.
//
// Files: routes.go registers every route; one middleware per mw_*.go file;
// handlers are methods of api, one idea per h_*.go file; errors.go is the
// error table; decode.go and validate.go check input at the edge; convert.go
// maps domain types to the wire types of broker/api/v1.
//
// # Middleware order
//
// request id → request logger → recover → dev-mode header → body limit,
// then per route authenticate and, on /admin routes, adminOnly. The
// request logger derives a per-request *slog.Logger (request_id, route;
// authenticate adds user) and writes exactly one line per request after the
// error handler answered: the one place where request errors are logged.
// Auth is attached per route rather than to an echo.Group, because a group
// with middleware registers catch-all routes that turn 405 into 404.
//
// # Errors
//
// Handlers return errors; handleError answers them with a v1.Error
// {code, message} chosen by errorTable (first matching row wins):
//
//	*http.MaxBytesError          413 bad_request
//	auth.ErrNoCredentials        401 unauthorized   WWW-Authenticate: Bearer realm="gpubroker"
//	auth.ErrUnauthenticated      401 unauthorized   ... error="invalid_token"; message = *auth.Error's Reason
//	auth.ErrUnavailable          503 unavailable    Retry-After: 5
//	auth.ErrCSRF                 403 forbidden      (session cookie without X-CSRF-Token)
//	*reclaim.ValidationError     400 bad_request    fields = every invalid field
//	fleet.ErrInvalid             400 bad_request
//	fleet.ErrQuotaExceeded       403 quota_exceeded message = *fleet.QuotaError's sentence
//	fleet.ErrForbidden           403 forbidden
//	fleet.ErrNotFound            404 not_found
//	fleet.ErrNoCapacity          409 no_capacity    message = *fleet.CapacityError's sentence
//	fleet.ErrConflict            409 conflict       (*reclaim.ConflictError says who changed what)
//	fleet.ErrNotReady            503 unavailable    Retry-After: 5, fixed message
//	fleet.ErrUnavailable         503 unavailable    Retry-After: 5
//	context.DeadlineExceeded     503 unavailable    Retry-After: 5
//	*echo.HTTPError              its status (unknown route 404, wrong method 405)
//	anything else                500 internal, "internal error; quote request id X ..."
//
// Messages come only from text written for people: typed errors' Error(),
// auth Reasons, and the wrap text around a fleet sentinel with the
// sentinel's own text removed (sentinelMessage). That is the contract with
// the services: wrap a fleet sentinel around a sentence for people
// (fmt.Errorf("%w: there is no profile %q", fleet.ErrInvalid, name)), and
// keep internal detail in errors that wrap no sentinel; those become a
// generic 500 and their text reaches only the log. Handlers therefore return
// service errors as they are, without adding context of their own.
//
// # Access
//
// A user acts only for themself, with the groups of their token. The
// JupyterHub service token (Principal.Hub) acts for any user, with that
// user's groups from X-Gpubroker-Groups only. An admin acts for anyone; for
// another user the groups also come from X-Gpubroker-Groups. Anyone else
// asking for another user's server, list or events gets the same 404 as for
// a server that does not exist. Admin routes answer 403 to non-admins; the
// hub is not an admin.
//
// # Events
//
// GET .../events is a server-sent event stream: replay after Last-Event-ID
// (or ?lastEventId=), then follow by calling Servers.Events with a block
// (default 15 s) and writing a keepalive comment after an empty block. The
// stream ends when the latest event is terminal and nothing follows it, or
// when the client leaves. Each write sets its own write deadline through
// http.ResponseController, so the http.Server's WriteTimeout does not cut
// long streams, and is flushed at once.
//
// # Invariants
//
//   - Every answer the tests receive validates against openapi.yaml
//     (kin-openapi), undocumented statuses included; /api errors are exactly
//     a v1.Error.
//   - A refused request (401, 403, 404 for a hidden resource, 400 at the
//     edge) never reaches the servers service's mutating methods.
//   - Internal error text never reaches a client.
//   - New starts no goroutines; the only goroutines are readyz's checks,
//     which it waits for (checks must honour their context).
package httpapi
