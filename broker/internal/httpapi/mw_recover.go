package httpapi

import (
	"fmt"
	"net/http"
	"runtime/debug"

	"github.com/labstack/echo/v4"
)

// panicError is a recovered panic. It wraps nothing on purpose: whatever
// the panic value was, the answer is a 500 with the generic message, and
// the request logger logs the value and the stack once.
type panicError struct {
	value any
	stack []byte
}

func (e *panicError) Error() string { return fmt.Sprint("panic: ", e.value) }

// recoverPanics turns a panic in a handler into a *panicError, which the
// error handler answers with 500 JSON. http.ErrAbortHandler is re-raised,
// as net/http expects.
func recoverPanics(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) (err error) {
		defer func() {
			r := recover()
			if r == nil {
				return
			}
			if r == http.ErrAbortHandler { //nolint:errorlint // identity is the contract of net/http
				panic(r)
			}
			err = &panicError{value: r, stack: debug.Stack()}
		}()
		return next(c)
	}
}
