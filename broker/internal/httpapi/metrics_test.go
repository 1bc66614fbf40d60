package httpapi

import (
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

// recordedRequest is one ObserveRequest call.
type recordedRequest struct {
	Method, Route string
	Code          int
	Stream        bool
}

// recordingMetrics records the API's measurements.
type recordingMetrics struct {
	mu       sync.Mutex
	requests []recordedRequest
	open     int
	opened   int
}

func (m *recordingMetrics) ObserveRequest(method, route string, code int, d time.Duration, stream bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if d < 0 {
		panic("negative duration")
	}
	m.requests = append(m.requests, recordedRequest{method, route, code, stream})
}

func (m *recordingMetrics) StreamOpened() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.open++
	m.opened++
}

func (m *recordingMetrics) StreamClosed() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.open--
}

// TestRequestsAreMeasuredByRouteAndStatus: every answer, errors included,
// is reported with its route template (never the raw path, which holds
// user names) and the status sent; an unknown path has no route; an event
// stream is marked and bracketed by StreamOpened and StreamClosed.
func TestRequestsAreMeasuredByRouteAndStatus(t *testing.T) {
	m := &recordingMetrics{}
	h := newHarness(t, harnessConfig{metrics: m})
	seedAlice(t, h)
	lifecycle(h, v1.StateFailed)
	h.do(t, req{method: "GET", path: "/api/v1/users/alice/servers/nb", token: tokAlice})
	h.do(t, req{method: "GET", path: "/api/v1/users/alice/servers/nb", token: tokBob})
	h.do(t, req{method: "PUT", path: "/api/v1/users/alice/servers/x", token: tokAlice, body: `{"profile":""}`})
	h.do(t, req{method: "GET", path: "/no/such/path"})
	h.do(t, req{method: "GET", path: "/api/v1/users/alice/servers/nb/events", token: tokAlice})
	want := []recordedRequest{
		{"PUT", "/api/v1/users/:user/servers/:name", 201, false}, // seedAlice
		{"GET", "/api/v1/users/:user/servers/:name", 200, false},
		{"GET", "/api/v1/users/:user/servers/:name", 404, false},
		{"PUT", "/api/v1/users/:user/servers/:name", 400, false},
		{"GET", "", 404, false},
		{"GET", "/api/v1/users/:user/servers/:name/events", 200, true},
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if diff := cmp.Diff(want, m.requests); diff != "" {
		t.Errorf("measured requests (-want +got):\n%s", diff)
	}
	if m.opened != 1 || m.open != 0 {
		t.Errorf("streams opened %d, still open %d; want 1 and 0", m.opened, m.open)
	}
}
