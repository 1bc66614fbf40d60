package httpapi

import (
	"crypto/rand"

	"github.com/labstack/echo/v4"
)

// maxRequestIDLen bounds a caller-supplied X-Request-ID.
const maxRequestIDLen = 64

// requestID gives every request an id in the X-Request-ID response header:
// the caller's X-Request-ID if it is 1..64 characters of [A-Za-z0-9._-]
// (so it cannot forge log lines), else a fresh random one.
func requestID(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		id := c.Request().Header.Get(echo.HeaderXRequestID)
		if !validRequestID(id) {
			id = rand.Text()
		}
		c.Response().Header().Set(echo.HeaderXRequestID, id)
		return next(c)
	}
}

func validRequestID(id string) bool {
	if id == "" || len(id) > maxRequestIDLen {
		return false
	}
	for _, r := range id {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-'
		if !ok {
			return false
		}
	}
	return true
}
