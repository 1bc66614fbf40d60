package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// HeaderLastEventID is the SSE reconnection header.
const HeaderLastEventID = "Last-Event-ID"

// writeMargin is how long one write to an event stream may take. Each write
// sets its own deadline (real time: deadlines are compared with the
// socket's clock), so the server's WriteTimeout does not cut the stream.
const writeMargin = 10 * time.Second

// serverEvents streams the server's lifecycle events as server-sent events.
// It replays the events after Last-Event-ID (header, or ?lastEventId=),
// then follows new ones, writing a keepalive comment whenever the events
// block passes without one. It ends when the server's latest event is
// terminal (stopped or failed) and nothing follows it, when the client
// goes away, or when the broker drains (WithDrain). Errors before the
// first byte are JSON answers; errors later end the stream with an
// `event: error` carrying a v1.Error.
func (a *api) serverEvents(c echo.Context) error {
	k, err := a.visibleKey(c)
	if err != nil {
		return err
	}
	after := c.Request().Header.Get(HeaderLastEventID)
	if after == "" {
		after = c.QueryParam("lastEventId")
	}
	if err := validEventID(after); err != nil {
		return err
	}
	ctx, stop := a.streamContext(c.Request().Context())
	defer stop()
	s, err := a.deps.Servers.Get(ctx, k)
	if errors.Is(err, fleet.ErrNotFound) {
		return serverNotFound(k)
	}
	if err != nil {
		return err
	}
	terminal := fleet.Terminal(s.State)
	var evs []fleet.Event
	if terminal {
		// Nothing follows a stopped or failed server's events but a new
		// spawn's: read what is there without waiting, and end. A live
		// one's first events come from the blocking read below, which
		// answers at once with those already there (one read fewer for
		// every stream opened on a starting server).
		if evs, err = a.deps.Servers.Events(ctx, k, after, 0); err != nil {
			return err
		}
	}

	w := c.Response()
	w.Header().Set(echo.HeaderContentType, "text/event-stream")
	w.Header().Set(echo.HeaderCacheControl, "no-cache")
	w.Header().Set("X-Accel-Buffering", "no") // no proxy buffering
	w.WriteHeader(http.StatusOK)
	a.deps.Metrics.StreamOpened()
	defer a.deps.Metrics.StreamClosed()
	out := &sse{w: w, rc: http.NewResponseController(w.Writer)}
	if err := out.flush(); err != nil {
		return err
	}

	for {
		if len(evs) > 0 {
			for _, ev := range evs {
				if err := out.event(ev); err != nil {
					return clientGone(ctx, err)
				}
			}
			last := evs[len(evs)-1]
			after, terminal = last.ID, fleet.Terminal(last.State)
			if terminal {
				// Read on without waiting: more may be retained (a new spawn).
				if evs, err = a.deps.Servers.Events(ctx, k, after, 0); err != nil {
					return a.streamFailed(ctx, c, out, err)
				}
				continue
			}
			// A live server's next events come from the blocking read below,
			// which answers at once with any already there: every follower of
			// an event reads on over the streams' own pool, never all of them
			// at once over the pool placement uses (the scale rig: 1,000
			// watchers reading on after each event timed out on it).
			evs = nil
		}
		if terminal {
			return nil
		}
		evs, err = a.deps.Servers.Events(ctx, k, after, a.opts.eventsBlock)
		if ctx.Err() != nil {
			return nil // the client went away, or the broker drains
		}
		if err != nil {
			return a.streamFailed(ctx, c, out, err)
		}
		if len(evs) == 0 {
			if err := out.comment("keepalive"); err != nil {
				return clientGone(ctx, err)
			}
		}
	}
}

// streamFailed ends a started stream with an error event chosen by the
// error table, and returns err for the request log; a stream whose ctx
// ended (the client left, the broker drains) just ends.
func (a *api) streamFailed(ctx context.Context, c echo.Context, out *sse, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	ans := decide(err, c.Response().Header().Get(echo.HeaderXRequestID))
	if data, merr := json.Marshal(ans.body); merr == nil {
		_ = out.raw("event: error\ndata: " + string(data) + "\n\n") // best effort; err is what matters
	}
	return err
}

// streamContext returns parent, also cancelled once the drain channel
// (WithDrain) is closed; stop releases it.
func (a *api) streamContext(parent context.Context) (ctx context.Context, stop context.CancelFunc) {
	ctx, cancel := context.WithCancel(parent)
	if a.opts.drain != nil {
		go func() {
			select {
			case <-a.opts.drain:
				cancel()
			case <-ctx.Done():
			}
		}()
	}
	return ctx, cancel
}

// clientGone hides write errors caused by the client leaving (or the
// stream's context ending otherwise: the broker drains).
func clientGone(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// sse writes server-sent events, one flushed write per event.
type sse struct {
	w  *echo.Response
	rc *http.ResponseController
}

// event writes ev as `id`, `event: state` and its v1.Event JSON as data.
func (s *sse) event(ev fleet.Event) error {
	data, err := json.Marshal(ev)
	if err != nil {
		return fmt.Errorf("encode event: %w", err)
	}
	return s.raw("id: " + oneLine(ev.ID) + "\nevent: state\ndata: " + string(data) + "\n\n")
}

// comment writes an SSE comment line, which clients ignore.
func (s *sse) comment(text string) error { return s.raw(": " + oneLine(text) + "\n\n") }

func (s *sse) raw(text string) error {
	if err := s.rc.SetWriteDeadline(time.Now().Add(writeMargin)); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return fmt.Errorf("set write deadline: %w", err)
	}
	if _, err := s.w.Write([]byte(text)); err != nil {
		return fmt.Errorf("write event stream: %w", err)
	}
	return s.flush()
}

func (s *sse) flush() error {
	if err := s.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return fmt.Errorf("flush event stream: %w", err)
	}
	return nil
}

// oneLine removes line breaks, which would end an SSE field early.
func oneLine(s string) string {
	return strings.NewReplacer("\r", "", "\n", "").Replace(s)
}

// validEventID checks a Last-Event-ID: an event id as the stream writes
// them, "<milliseconds>-<sequence>" (or just "<milliseconds>"), both
// unsigned 64-bit numbers.
func validEventID(id string) error {
	if id == "" {
		return nil
	}
	ms, seq, two := strings.Cut(id, "-")
	if !decimal64(ms) || (two && !decimal64(seq)) {
		shown := id
		if len(shown) > 64 {
			shown = shown[:64] + "…"
		}
		return fmt.Errorf("%w: last event id %q is not an event id of this stream (<milliseconds>-<sequence>, each a number below 2^64)", fleet.ErrInvalid, shown)
	}
	return nil
}

// decimal64 reports whether s is an unsigned decimal that fits 64 bits.
func decimal64(s string) bool {
	if s == "" || len(s) > 20 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	_, err := strconv.ParseUint(s, 10, 64)
	return err == nil
}
