package httpapi

import "github.com/labstack/echo/v4"

// routes registers every route and middleware. Before routing: OPTIONS is
// 405 (noOptions). Order of the common middleware: metrics → request id → request logger → recover → dev-mode header →
// body limit. Per route: query (the query parameters it takes; every route
// declares them, none if it takes none), then authenticate (and
// adminOnly), attached per route, not to an echo.Group: a group with
// middleware registers catch-all routes, which would turn 405 (wrong
// method) into 404.
func (a *api) routes(e *echo.Echo) {
	e.Pre(noOptions)
	e.Use(measure(a.deps.Metrics), requestID, requestLogger(a.deps.Log), recoverPanics)
	if a.deps.Mode.Simulated {
		e.Use(modeHeader)
	}
	e.Use(bodyLimit(a.opts.bodyLimitBytes))

	none := query()
	e.GET("/healthz", a.healthz, none)
	e.GET("/readyz", a.readyz, none)
	e.GET("/api/v1/", a.info, none)
	e.GET("/api/v1/openapi.yaml", a.openapi, none)

	user := a.authenticate
	e.GET("/api/v1/me", a.me, none, user)
	e.GET("/api/v1/profiles", a.profiles, none, user)
	e.GET("/api/v1/servers", a.listServers, query("all", "user", "limit", "cursor"), user)
	e.GET("/api/v1/users/:user/servers", a.listUserServers, query("limit", "cursor"), user)
	e.GET("/api/v1/users/:user/quota", a.userQuota, none, user)
	e.PUT("/api/v1/users/:user/servers/:name", a.createServer, none, user)
	e.GET("/api/v1/users/:user/servers/:name", a.getServer, none, user)
	e.DELETE("/api/v1/users/:user/servers/:name", a.deleteServer, query("remove"), user)
	e.GET("/api/v1/users/:user/servers/:name/events", a.serverEvents, query("lastEventId"), user)
	if a.deps.Resize != nil {
		e.PATCH("/api/v1/users/:user/servers/:name/slice", a.resizeServer, none, user)
	}
	if a.deps.Reclaim != nil {
		e.GET("/api/v1/users/:user/servers/:name/idle", a.getIdleState, none, user)
		e.POST("/api/v1/users/:user/servers/:name/extend", a.extendServer, none, user)
	}

	e.GET("/api/v1/admin/gpus", a.listGPUs, none, user, a.adminOnly)
	e.PUT("/api/v1/admin/gpus/:uuid", a.putGPU, none, user, a.adminOnly)
	e.PUT("/api/v1/admin/gpus/:uuid/mode", a.putGPUMode, none, user, a.adminOnly)
	if a.deps.Policy != nil {
		e.GET("/api/v1/admin/reclaim-policy", a.getReclaimPolicy, none, user, a.adminOnly)
		e.PUT("/api/v1/admin/reclaim-policy", a.putReclaimPolicy, query("validate"), user, a.adminOnly)
	}
	if a.deps.Reclaim != nil {
		e.POST("/api/v1/admin/reclaim-policy/preview", a.previewReclaimPolicy, none, user, a.adminOnly)
	}
	if a.deps.Audit != nil {
		e.GET("/api/v1/admin/audit", a.listAudit, query("source", "actor", "action", "target", "user", "server", "before", "limit"), user, a.adminOnly)
	}
}
