package httpapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"

	"github.com/labstack/echo/v4"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/auth"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/internal/reclaim"
)

// answer is what the error table decides for one error.
type answer struct {
	status  int
	body    v1.Error
	headers map[string]string
}

// errorRule is one row of the error table: the first row whose match is
// true decides the answer.
type errorRule struct {
	match  func(err error) bool
	status int
	code   string
	// message builds the text a person reads. It may only use text written
	// for people: typed errors' Error(), *auth.Error's Reason, or the wrap
	// text around a fleet sentinel (see sentinelMessage).
	message func(err error) string
	headers map[string]string
	// fields, if set, lists the invalid fields (v1.Error.Fields).
	fields func(err error) []v1.FieldProblem
	// limit, if set, says what limit a refusal hit (v1.Error.Limit).
	limit func(err error) *v1.Limit
}

// is returns a matcher for errors.Is(err, target).
func is(target error) func(error) bool {
	return func(err error) bool { return errors.Is(err, target) }
}

// errorTable maps errors to answers; the order matters (typed errors come
// before the sentinels they also match). Anything that matches no row is an
// internal failure: 500 with a generic message, logged by the request logger.
var errorTable = []errorRule{
	{
		match:  func(err error) bool { var e *http.MaxBytesError; return errors.As(err, &e) },
		status: http.StatusRequestEntityTooLarge, code: v1.CodePayloadTooLarge,
		message: func(err error) string {
			var e *http.MaxBytesError
			errors.As(err, &e)
			return "the request body is larger than " + byteSize(e.Limit)
		},
	},
	{
		match:  is(errMediaType),
		status: http.StatusUnsupportedMediaType, code: v1.CodeUnsupportedMediaType,
		message: func(err error) string {
			return strings.TrimPrefix(strings.TrimPrefix(err.Error(), errMediaType.Error()), ": ")
		},
	},
	{
		// Before the sentinels: an outage that a deadline or a conflict
		// also matches is still an outage.
		match:  func(err error) bool { var e *fleet.UnavailableError; return errors.As(err, &e) },
		status: http.StatusServiceUnavailable, code: v1.CodeUnavailable,
		message: func(err error) string {
			var e *fleet.UnavailableError
			errors.As(err, &e)
			return e.Message()
		},
		headers: map[string]string{echo.HeaderRetryAfter: "5"},
	},
	{
		// Before ErrUnauthenticated, which it also matches: no error code in
		// WWW-Authenticate when no credentials were sent (RFC 6750 §3.1).
		match:  is(auth.ErrNoCredentials),
		status: http.StatusUnauthorized, code: v1.CodeUnauthorized,
		message: authReason,
		headers: map[string]string{echo.HeaderWWWAuthenticate: `Bearer realm="gpubroker"`},
	},
	{
		match:  is(auth.ErrUnauthenticated),
		status: http.StatusUnauthorized, code: v1.CodeUnauthorized,
		message: authReason,
		headers: map[string]string{echo.HeaderWWWAuthenticate: `Bearer realm="gpubroker", error="invalid_token"`},
	},
	{
		match:  is(auth.ErrUnavailable),
		status: http.StatusServiceUnavailable, code: v1.CodeUnavailable,
		message: func(error) string { return "the identity provider cannot be reached; try again shortly" },
		headers: map[string]string{echo.HeaderRetryAfter: "5"},
	},
	{
		match:  is(auth.ErrCSRF),
		status: http.StatusForbidden, code: v1.CodeForbidden,
		message: func(error) string {
			return "this request lacks your session's CSRF token (header " + auth.CSRFHeader + "); reload the page and try again"
		},
	},
	{
		match:  func(err error) bool { var e *reclaim.ValidationError; return errors.As(err, &e) },
		status: http.StatusBadRequest, code: v1.CodeBadRequest,
		message: sentinelMessage("the request is not valid"),
		fields: func(err error) []v1.FieldProblem {
			var e *reclaim.ValidationError
			errors.As(err, &e)
			out := make([]v1.FieldProblem, len(e.Problems))
			for i, p := range e.Problems {
				out[i] = v1.FieldProblem{Field: p.Field, Message: p.Message}
			}
			return out
		},
	},
	{
		match:  func(err error) bool { var e *fieldsError; return errors.As(err, &e) },
		status: http.StatusBadRequest, code: v1.CodeBadRequest,
		message: sentinelMessage("the request is not valid"),
		fields: func(err error) []v1.FieldProblem {
			var e *fieldsError
			errors.As(err, &e)
			return e.problems
		},
	},
	{
		match:  is(fleet.ErrInvalid),
		status: http.StatusBadRequest, code: v1.CodeBadRequest,
		message: sentinelMessage("the request is not valid"),
	},
	{
		match:  is(fleet.ErrQuotaExceeded),
		status: http.StatusForbidden, code: v1.CodeQuotaExceeded,
		message: func(err error) string {
			var e *fleet.QuotaError
			if errors.As(err, &e) {
				return e.Error()
			}
			return sentinelMessage("a quota would be exceeded")(err)
		},
		limit: func(err error) *v1.Limit {
			var e *fleet.QuotaError
			if !errors.As(err, &e) {
				return nil
			}
			return &v1.Limit{Kind: v1.LimitQuota, Scope: e.Scope, Name: e.Name, Resource: e.Resource, Limit: e.Limit, Used: e.Used, Want: e.Want}
		},
	},
	{
		match:  is(fleet.ErrForbidden),
		status: http.StatusForbidden, code: v1.CodeForbidden,
		message: sentinelMessage("you may not do this"),
	},
	{
		match:  is(fleet.ErrNotFound),
		status: http.StatusNotFound, code: v1.CodeNotFound,
		message: sentinelMessage("not found"),
	},
	{
		match:  is(fleet.ErrNoCapacity),
		status: http.StatusConflict, code: v1.CodeNoCapacity,
		message: func(err error) string {
			var e *fleet.CapacityError
			if errors.As(err, &e) {
				return e.Error()
			}
			return sentinelMessage("no GPU has room for this slice")(err)
		},
		limit: func(err error) *v1.Limit {
			var r *fleet.RoomError
			if errors.As(err, &r) {
				if r.Want.MemoryMiB > r.MaxMiB {
					return &v1.Limit{Kind: v1.LimitGPU, Scope: v1.LimitScopeServer, Name: r.Node, Resource: "memoryMiB", Limit: r.MaxMiB, Want: r.Want.MemoryMiB}
				}
				return &v1.Limit{Kind: v1.LimitGPU, Scope: v1.LimitScopeServer, Name: r.Node, Resource: "computePercent", Limit: int64(r.MaxComputePercent), Want: int64(r.Want.ComputePercent)}
			}
			var e *fleet.CapacityError
			if !errors.As(err, &e) || e.Candidates == 0 {
				return nil
			}
			if e.LargestFreeMiB < e.Want.MemoryMiB {
				return &v1.Limit{Kind: v1.LimitGPU, Name: e.LargestNode, Resource: "memoryMiB", Limit: e.LargestFreeMiB, Want: e.Want.MemoryMiB}
			}
			return &v1.Limit{Kind: v1.LimitGPU, Name: e.LargestNode, Resource: "computePercent", Limit: int64(e.LargestFreeComputePercent), Want: int64(e.Want.ComputePercent)}
		},
	},
	{
		match:  func(err error) bool { var e *fleet.InUseError; return errors.As(err, &e) },
		status: http.StatusConflict, code: v1.CodeConflict,
		message: func(err error) string {
			var e *fleet.InUseError
			errors.As(err, &e)
			return e.Error()
		},
		limit: func(err error) *v1.Limit {
			var e *fleet.InUseError
			errors.As(err, &e)
			return &v1.Limit{Kind: v1.LimitInUse, Resource: "memoryMiB", Limit: e.UsedMiB, Want: e.WantMiB}
		},
	},
	{
		// Its own words, whatever context was wrapped around it.
		match:  func(err error) bool { var e *fleet.StateError; return errors.As(err, &e) },
		status: http.StatusConflict, code: v1.CodeConflict,
		message: func(err error) string {
			var e *fleet.StateError
			errors.As(err, &e)
			return e.Error()
		},
	},
	{
		match:  is(fleet.ErrConflict),
		status: http.StatusConflict, code: v1.CodeConflict,
		message: sentinelMessage("the request conflicts with the current state"),
	},
	{
		// One meaning, one sentence: the wrap text is an operation name here.
		match:  is(fleet.ErrNotReady),
		status: http.StatusServiceUnavailable, code: v1.CodeUnavailable,
		message: func(error) string { return notReadyMessage },
		headers: map[string]string{echo.HeaderRetryAfter: "5"},
	},
	{
		match:  is(fleet.ErrUnavailable),
		status: http.StatusServiceUnavailable, code: v1.CodeUnavailable,
		message: sentinelMessage("a part of the cluster did not answer; try again shortly"),
		headers: map[string]string{echo.HeaderRetryAfter: "5"},
	},
	{
		match:  is(context.DeadlineExceeded),
		status: http.StatusServiceUnavailable, code: v1.CodeUnavailable,
		message: func(error) string { return "the broker timed out; try again" },
		headers: map[string]string{echo.HeaderRetryAfter: "5"},
	},
	{
		// After the deadline rule: context.DeadlineExceeded is a net.Error
		// too. A connection to Redis or the API server refused or cut (a
		// Redis failover, a restarting API server): retrying soon works.
		match:  unreachable,
		status: http.StatusServiceUnavailable, code: v1.CodeUnavailable,
		message: func(error) string {
			return "the broker cannot reach its store or the cluster right now; try again in a few seconds"
		},
		headers: map[string]string{echo.HeaderRetryAfter: "2"},
	},
}

// unreachable matches network failures: a connection refused, reset or
// closed mid-answer.
func unreachable(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

const notReadyMessage = "the broker is rebuilding its allocations; try again in a few seconds"

// decide maps err to its answer using errorTable, then echo's own errors
// (unknown route, wrong method), then the internal-error fallback.
func decide(err error, requestID string) answer {
	for _, r := range errorTable {
		if r.match(err) {
			ans := answer{status: r.status, body: v1.Error{Code: r.code, Message: r.message(err)}, headers: r.headers}
			if r.fields != nil {
				ans.body.Fields = r.fields(err)
			}
			if r.limit != nil {
				ans.body.Limit = r.limit(err)
			}
			return ans
		}
	}
	var he *echo.HTTPError
	if errors.As(err, &he) {
		return answer{status: he.Code, body: v1.Error{Code: codeForStatus(he.Code), Message: httpErrorMessage(he)}}
	}
	msg := "internal error"
	if requestID != "" {
		msg = fmt.Sprintf("internal error; quote request id %s when you report it", requestID)
	}
	return answer{status: http.StatusInternalServerError, body: v1.Error{Code: v1.CodeInternal, Message: msg}}
}

// handleError is the echo HTTPErrorHandler: it writes the answer that
// decide chooses as JSON. It logs nothing: the request logger writes one
// line per request that includes the error.
func (a *api) handleError(err error, c echo.Context) {
	if c.Response().Committed {
		return // a stream already started; the request logger records err
	}
	ans := decide(err, c.Response().Header().Get(echo.HeaderXRequestID))
	if ans.status == http.StatusMethodNotAllowed {
		ans.body.Message = fmt.Sprintf("method %s is not allowed on %s", c.Request().Method, c.Request().URL.Path)
	}
	if ans.status == http.StatusNotFound && errors.Is(err, echo.ErrNotFound) {
		ans.body.Message = fmt.Sprintf("no route for %s %s", c.Request().Method, c.Request().URL.Path)
	}
	for k, v := range ans.headers {
		c.Response().Header().Set(k, v)
	}
	var werr error
	if c.Request().Method == http.MethodHead {
		werr = c.NoContent(ans.status)
	} else {
		werr = c.JSON(ans.status, ans.body)
	}
	if werr != nil {
		loggerFrom(c, a.deps.Log).Debug("write error answer", "err", werr)
	}
}

// fleetSentinels are the sentinels whose text sentinelMessage removes.
var fleetSentinels = []error{
	fleet.ErrNotFound, fleet.ErrConflict, fleet.ErrNoCapacity, fleet.ErrQuotaExceeded,
	fleet.ErrInvalid, fleet.ErrForbidden, fleet.ErrNotReady, fleet.ErrUnavailable,
}

// sentinelMessage returns a message builder for errors that wrap a fleet
// sentinel: the error's text without the sentinels' own text, wherever the
// wrap put it (`fleet: invalid: profile is required` and
// `profile is required: fleet: invalid` both become `profile is required`).
// Joined errors (one per line) are joined with "; ". An error that is only
// a sentinel gives fallback.
//
// This is the contract for the rest of the broker: an error that wraps a
// fleet sentinel carries text written for people around it, and internal
// details go into errors that wrap no sentinel (those become a generic 500).
// Handlers therefore return service errors without adding their own
// context: the request log line already names the route.
func sentinelMessage(fallback string) func(error) string {
	return func(err error) string {
		msg := err.Error()
		for _, st := range fleetSentinels {
			t := st.Error()
			msg = strings.ReplaceAll(msg, ": "+t+": ", ": ")
			msg = strings.TrimPrefix(msg, t+": ")
			msg = strings.TrimSuffix(msg, ": "+t)
			if msg == t {
				msg = ""
			}
		}
		lines := strings.FieldsFunc(msg, func(r rune) bool { return r == '\n' })
		for i := range lines {
			lines[i] = strings.TrimSpace(lines[i])
		}
		msg = strings.Join(slices.DeleteFunc(lines, func(l string) bool { return l == "" }), "; ")
		if msg == "" {
			return fallback
		}
		return msg
	}
}

// authReason is the readable reason of an *auth.Error.
func authReason(err error) string {
	var e *auth.Error
	if errors.As(err, &e) && e.Reason != "" {
		return e.Reason
	}
	return "the credentials are not valid"
}

// codeForStatus names echo's own HTTP errors with the v1 error codes.
func codeForStatus(status int) string {
	switch {
	case status == http.StatusUnauthorized:
		return v1.CodeUnauthorized
	case status == http.StatusForbidden:
		return v1.CodeForbidden
	case status == http.StatusNotFound:
		return v1.CodeNotFound
	case status == http.StatusConflict:
		return v1.CodeConflict
	case status == http.StatusMethodNotAllowed:
		return v1.CodeMethodNotAllowed
	case status == http.StatusRequestEntityTooLarge:
		return v1.CodePayloadTooLarge
	case status == http.StatusUnsupportedMediaType:
		return v1.CodeUnsupportedMediaType
	case status == http.StatusServiceUnavailable:
		return v1.CodeUnavailable
	case status >= 500:
		return v1.CodeInternal
	default:
		return v1.CodeBadRequest
	}
}

// httpErrorMessage is the text of an echo.HTTPError, or the status text.
func httpErrorMessage(he *echo.HTTPError) string {
	if m, ok := he.Message.(string); ok && m != "" && he.Code < 500 {
		return strings.ToLower(m[:1]) + m[1:]
	}
	return strings.ToLower(http.StatusText(he.Code))
}

// byteSize words a body limit for people: whole MiB or KiB with the exact
// bytes after it ("1 MiB (1048576 bytes)"), else bytes ("64 bytes").
func byteSize(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB (%d bytes)", n>>20, n)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB (%d bytes)", n>>10, n)
	default:
		return fmt.Sprintf("%d bytes", n)
	}
}
