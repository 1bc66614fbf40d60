package httpapi

import "github.com/labstack/echo/v4"

// routes registers every route and middleware. Order of the common
// middleware: request id → request logger → recover → dev-mode header →
// body limit. authenticate (and adminOnly) are attached per route, not to
// an echo.Group: a group with middleware registers catch-all routes, which
// would turn 405 (wrong method) into 404.
func (a *api) routes(e *echo.Echo) {
	e.Use(requestID, requestLogger(a.deps.Log), recoverPanics)
	if a.deps.Mode.Simulated {
		e.Use(modeHeader)
	}
	e.Use(bodyLimit(a.opts.bodyLimitBytes))

	e.GET("/healthz", a.healthz)
	e.GET("/readyz", a.readyz)
	e.GET("/api/v1/", a.info)
	e.GET("/api/v1/openapi.yaml", a.openapi)

	user := a.authenticate
	e.GET("/api/v1/me", a.me, user)
	e.GET("/api/v1/profiles", a.profiles, user)
	e.GET("/api/v1/servers", a.listServers, user)
	e.GET("/api/v1/users/:user/servers", a.listUserServers, user)
	e.PUT("/api/v1/users/:user/servers/:name", a.createServer, user)
	e.GET("/api/v1/users/:user/servers/:name", a.getServer, user)
	e.DELETE("/api/v1/users/:user/servers/:name", a.deleteServer, user)
	e.GET("/api/v1/users/:user/servers/:name/events", a.serverEvents, user)
	if a.deps.Resize != nil {
		e.PATCH("/api/v1/users/:user/servers/:name/slice", a.resizeServer, user)
	}
	if a.deps.Reclaim != nil {
		e.GET("/api/v1/users/:user/servers/:name/idle", a.getIdleState, user)
		e.POST("/api/v1/users/:user/servers/:name/extend", a.extendServer, user)
	}

	e.GET("/api/v1/admin/gpus", a.listGPUs, user, a.adminOnly)
	e.PUT("/api/v1/admin/gpus/:uuid", a.putGPU, user, a.adminOnly)
	e.PUT("/api/v1/admin/gpus/:uuid/mode", a.putGPUMode, user, a.adminOnly)
	if a.deps.Policy != nil {
		e.GET("/api/v1/admin/reclaim-policy", a.getReclaimPolicy, user, a.adminOnly)
		e.PUT("/api/v1/admin/reclaim-policy", a.putReclaimPolicy, user, a.adminOnly)
	}
	if a.deps.Reclaim != nil {
		e.POST("/api/v1/admin/reclaim-policy/preview", a.previewReclaimPolicy, user, a.adminOnly)
	}
	if a.deps.Audit != nil {
		e.GET("/api/v1/admin/audit", a.listAudit, user, a.adminOnly)
	}
}
