package httpapi

import (
	"time"

	"github.com/labstack/echo/v4"
)

// eventsRoute is the event stream's route template.
const eventsRoute = "/api/v1/users/:user/servers/:name/events"

// measure reports every answered request to m: method, route template,
// status and time to answer. It is the outermost middleware, so the error
// handler (run by the request logger) has written the status it reads.
func measure(m Metrics) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			start := time.Now()
			err := next(c)
			if err != nil && !c.Response().Committed {
				c.Error(err) // answer now, so the status is the one sent
			}
			route := c.Path()
			m.ObserveRequest(c.Request().Method, route, c.Response().Status, time.Since(start), route == eventsRoute)
			return err
		}
	}
}
