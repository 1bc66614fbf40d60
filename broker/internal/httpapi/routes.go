package httpapi

import "github.com/labstack/echo/v4"

// routes registers every route and middleware. Order of the common
// middleware: request id → request logger → recover → dev-mode header →
// body limit; authenticate (and adminOnly) apply per group.
func (a *api) routes(e *echo.Echo) {
	e.Use(requestID, requestLogger(a.deps.Log), recoverPanics)
	if a.deps.Mode.Simulated {
		e.Use(modeHeader)
	}
	e.Use(bodyLimit(a.opts.bodyLimitBytes))

	e.GET("/healthz", a.healthz)
	e.GET("/readyz", a.readyz)

	pub := e.Group("/api/v1")
	pub.GET("/", a.info)
	pub.GET("/openapi.yaml", a.openapi)

	api := e.Group("/api/v1", a.authenticate)
	api.GET("/me", a.me)
	api.GET("/profiles", a.profiles)
	api.GET("/servers", a.listServers)
	api.GET("/users/:user/servers", a.listUserServers)
	api.PUT("/users/:user/servers/:name", a.createServer)
	api.GET("/users/:user/servers/:name", a.getServer)
	api.DELETE("/users/:user/servers/:name", a.deleteServer)
	api.GET("/users/:user/servers/:name/events", a.serverEvents)

	admin := api.Group("/admin", a.adminOnly)
	admin.GET("/gpus", a.listGPUs)
	admin.PUT("/gpus/:uuid", a.putGPU)
}
