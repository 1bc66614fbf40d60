package httpapi

import (
	"context"
	"errors"
	"log/slog"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
)

// loggerKey is the request-context key of the per-request logger.
type loggerKey struct{}

// withLogger stores log in c's request context.
func withLogger(c echo.Context, log *slog.Logger) {
	c.SetRequest(c.Request().WithContext(context.WithValue(c.Request().Context(), loggerKey{}, log)))
}

// loggerFrom returns the per-request logger (carrying request_id, route and,
// once authenticated, user), or base outside a request.
func loggerFrom(c echo.Context, base *slog.Logger) *slog.Logger {
	if l, ok := c.Request().Context().Value(loggerKey{}).(*slog.Logger); ok {
		return l
	}
	return base
}

// requestLogger derives the per-request logger before the handler runs and
// writes one line per request after the error handler has answered: info
// for answers below 500 (debug for passing health probes), error (with the error and, for panics, the stack)
// for the rest. It is the only place where request errors are logged.
func requestLogger(base *slog.Logger) echo.MiddlewareFunc {
	return middleware.RequestLoggerWithConfig(middleware.RequestLoggerConfig{
		HandleError:  true,
		LogStatus:    true,
		LogLatency:   true,
		LogMethod:    true,
		LogURIPath:   true,
		LogRoutePath: true,
		LogError:     true,
		BeforeNextFunc: func(c echo.Context) {
			withLogger(c, base.With(
				"request_id", c.Response().Header().Get(echo.HeaderXRequestID),
				"route", c.Path(),
			))
		},
		LogValuesFunc: func(c echo.Context, v middleware.RequestLoggerValues) error {
			attrs := []slog.Attr{
				slog.String("method", v.Method),
				slog.String("path", v.URIPath),
				slog.Int("status", v.Status),
				slog.Duration("duration", v.Latency),
			}
			level := slog.LevelInfo
			if (v.RoutePath == "/healthz" || v.RoutePath == "/readyz") && v.Status < 400 {
				level = slog.LevelDebug // probes every few seconds; failures stay visible
			}
			if v.Error != nil {
				attrs = append(attrs, slog.String("err", v.Error.Error()))
				if v.Status >= 500 {
					level = slog.LevelError
				}
				var p *panicError
				if errors.As(v.Error, &p) {
					attrs = append(attrs, slog.String("stack", string(p.stack)))
				}
			}
			loggerFrom(c, base).LogAttrs(c.Request().Context(), level, "request", attrs...)
			return nil
		},
	})
}
