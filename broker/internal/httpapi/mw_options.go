package httpapi

import (
	"net/http"

	"github.com/labstack/echo/v4"
)

// noOptions answers OPTIONS with the API's own 405, as every other method
// a route does not take: the API serves no CORS preflights (the pages are
// same-origin), and echo's default would be an undocumented 204.
func noOptions(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if c.Request().Method == http.MethodOptions {
			return echo.ErrMethodNotAllowed
		}
		return next(c)
	}
}
