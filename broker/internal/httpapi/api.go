package httpapi

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/labstack/echo/v4"
)

// Defaults of the options.
const (
	// DefaultEventsBlock is how long the events stream waits for a new event
	// before it writes a keepalive comment.
	DefaultEventsBlock = 15 * time.Second
	// DefaultReadyTimeout bounds each readiness check.
	DefaultReadyTimeout = 2 * time.Second
	// DefaultBodyLimitBytes is the largest request body accepted (1 MiB).
	DefaultBodyLimitBytes = 1 << 20
)

// Option changes a default of New.
type Option func(*options)

type options struct {
	eventsBlock    time.Duration
	readyTimeout   time.Duration
	bodyLimitBytes int64
	drain          <-chan struct{}
}

// WithDrain makes every event stream end, as a stream ends when its client
// goes away (no error event), once drain is closed: a graceful shutdown
// closes it when it stops accepting connections, so that the streams,
// which would otherwise last as long as their clients, do not hold it up
// while the other requests run to their end. Default nil: streams end
// only by themselves or with their request's context.
func WithDrain(drain <-chan struct{}) Option {
	return func(o *options) { o.drain = drain }
}

// WithEventsBlock sets how long the events stream waits for a new event
// before it writes a keepalive comment; default DefaultEventsBlock. Values
// ≤ 0 keep the default.
func WithEventsBlock(d time.Duration) Option {
	return func(o *options) {
		if d > 0 {
			o.eventsBlock = d
		}
	}
}

// WithReadyTimeout bounds each readiness check; default DefaultReadyTimeout.
// Values ≤ 0 keep the default.
func WithReadyTimeout(d time.Duration) Option {
	return func(o *options) {
		if d > 0 {
			o.readyTimeout = d
		}
	}
}

// WithBodyLimitBytes sets the largest request body accepted, in bytes;
// default DefaultBodyLimitBytes. Values ≤ 0 keep the default.
func WithBodyLimitBytes(n int64) Option {
	return func(o *options) {
		if n > 0 {
			o.bodyLimitBytes = n
		}
	}
}

// api holds the handlers' dependencies; its methods are the handlers.
type api struct {
	deps Deps
	opts options
}

// New returns the broker's HTTP API as an *echo.Echo, ready to be served by
// an http.Server (which owns the timeouts) or used as an http.Handler. It
// starts no goroutines. It returns an error naming every missing required
// dependency.
func New(deps Deps, opts ...Option) (*echo.Echo, error) {
	var errs []error
	if deps.Servers == nil {
		errs = append(errs, errors.New("httpapi: Deps.Servers is nil"))
	}
	if deps.Profiles == nil {
		errs = append(errs, errors.New("httpapi: Deps.Profiles is nil"))
	}
	if deps.Fleet == nil {
		errs = append(errs, errors.New("httpapi: Deps.Fleet is nil"))
	}
	if deps.Auth == nil {
		errs = append(errs, errors.New("httpapi: Deps.Auth is nil"))
	}
	if deps.Log == nil {
		errs = append(errs, errors.New("httpapi: Deps.Log is nil"))
	}
	for i, c := range deps.Checkers {
		if c == nil {
			errs = append(errs, fmt.Errorf("httpapi: Deps.Checkers[%d] is nil", i))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if deps.Version == "" {
		deps.Version = "dev"
	}
	if deps.Mode.Simulated && deps.Mode.Notice == "" {
		deps.Mode.Notice = DefaultSimulatedNotice
	}
	if deps.Now == nil {
		deps.Now = time.Now
	}
	if deps.Metrics == nil {
		deps.Metrics = noMetrics{}
	}
	o := options{
		eventsBlock:    DefaultEventsBlock,
		readyTimeout:   DefaultReadyTimeout,
		bodyLimitBytes: DefaultBodyLimitBytes,
	}
	for _, opt := range opts {
		opt(&o)
	}

	a := &api{deps: deps, opts: o}
	e := echo.New()
	e.HideBanner = true
	e.HidePort = true
	e.Logger.SetOutput(slogWriter{deps.Log})
	e.HTTPErrorHandler = a.handleError
	a.routes(e)
	return e, nil
}

// slogWriter sends the few lines echo's own logger writes (for example
// when Start fails) to slog, so nothing bypasses the structured log.
type slogWriter struct{ log *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	w.log.Warn("echo log", "line", string(p))
	return len(p), nil
}
