package httpapi

import (
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// query lets a request through only if its query string is well formed
// and names nothing but allowed, each at most once and with a value. Every
// route declares its parameters with it in routes.go, so a misspelt
// parameter (?limt=5) is a 400 naming the ones the route takes, never
// silently ignored; and a value echo's parser would drop (a bad
// percent-escape, a ';') is a 400 too.
func query(allowed ...string) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			raw := c.Request().URL.RawQuery
			if raw == "" {
				return next(c)
			}
			vals, err := url.ParseQuery(raw)
			if err != nil {
				return fmt.Errorf("%w: the query string is not properly escaped: %s", fleet.ErrInvalid, strings.TrimPrefix(err.Error(), "invalid URL escape "))
			}
			for _, name := range slices.Sorted(maps.Keys(vals)) {
				v := vals[name]
				switch {
				case !slices.Contains(allowed, name) && len(allowed) == 0:
					return fmt.Errorf("%w: query parameter %q is not one of this route's; it takes none", fleet.ErrInvalid, name)
				case !slices.Contains(allowed, name):
					return fmt.Errorf("%w: query parameter %q is not one of this route's (%s)", fleet.ErrInvalid, name, strings.Join(allowed, ", "))
				case len(v) > 1:
					return fmt.Errorf("%w: query parameter %s is given %d times; give it once", fleet.ErrInvalid, name, len(v))
				case v[0] == "":
					return fmt.Errorf("%w: query parameter %s has no value", fleet.ErrInvalid, name)
				}
			}
			return next(c)
		}
	}
}
