package httpapi

import (
	"net/http"

	"github.com/labstack/echo/v4"
)

// bodyLimit refuses request bodies larger than limit bytes: at once when
// Content-Length says so, otherwise when reading passes the limit (the
// reader then fails with *http.MaxBytesError, which the error table answers
// with 413).
func bodyLimit(limit int64) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			req := c.Request()
			if req.ContentLength > limit {
				return &http.MaxBytesError{Limit: limit}
			}
			if req.Body != nil {
				req.Body = http.MaxBytesReader(c.Response(), req.Body, limit)
			}
			return next(c)
		}
	}
}
