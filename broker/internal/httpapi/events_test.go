package httpapi

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// sseMsg is one parsed server-sent message: an event or a comment.
type sseMsg struct {
	ID, Event, Data, Comment string
}

// sseReader parses a text/event-stream.
type sseReader struct{ r *bufio.Reader }

// next returns the next message, or io.EOF when the stream ended.
func (s *sseReader) next() (sseMsg, error) {
	var m sseMsg
	seen := false
	for {
		line, err := s.r.ReadString('\n')
		if err != nil {
			if errors.Is(err, io.EOF) && !seen && line == "" {
				return m, io.EOF
			}
			return m, err
		}
		line = strings.TrimSuffix(line, "\n")
		switch {
		case line == "":
			if seen {
				return m, nil
			}
		case strings.HasPrefix(line, ": "):
			m.Comment, seen = strings.TrimPrefix(line, ": "), true
		case strings.HasPrefix(line, "id: "):
			m.ID, seen = strings.TrimPrefix(line, "id: "), true
		case strings.HasPrefix(line, "event: "):
			m.Event, seen = strings.TrimPrefix(line, "event: "), true
		case strings.HasPrefix(line, "data: "):
			m.Data, seen = strings.TrimPrefix(line, "data: "), true
		default:
			return m, io.ErrUnexpectedEOF
		}
	}
}

// readAll parses a whole finished stream.
func readAll(t *testing.T, body string) []sseMsg {
	t.Helper()
	r := &sseReader{bufio.NewReader(strings.NewReader(body))}
	var out []sseMsg
	for {
		m, err := r.next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("parse stream: %v: %q", err, body)
		}
		out = append(out, m)
	}
}

// states decodes the data of state events and checks id = data.id.
func states(t *testing.T, msgs []sseMsg) []v1.ServerState {
	t.Helper()
	var out []v1.ServerState
	for _, m := range msgs {
		if m.Comment != "" {
			continue
		}
		if m.Event != "state" {
			t.Fatalf("event %q, want state: %+v", m.Event, m)
		}
		var ev v1.Event
		if err := json.Unmarshal([]byte(m.Data), &ev); err != nil {
			t.Fatalf("data: %v: %s", err, m.Data)
		}
		if ev.ID != m.ID || ev.SpawnID == "" || !ev.Time.Equal(testNow) {
			t.Errorf("event %+v under id %q", ev, m.ID)
		}
		out = append(out, ev.State)
	}
	return out
}

// lifecycle moves alice/nb through states, appending one event each.
func lifecycle(h *harness, ss ...v1.ServerState) {
	for _, s := range ss {
		h.servers.advance(fleet.ServerKey{User: "alice", Name: "nb"}, s, "now "+string(s))
	}
}

// TestEventsReplay covers streams that end by themselves, through
// e.ServeHTTP: replay from the start, after Last-Event-ID (header or
// query), and a terminal server with nothing after the given id.
func TestEventsReplay(t *testing.T) {
	const path = "/api/v1/users/alice/servers/nb/events"
	tests := []struct {
		name   string
		path   string
		header map[string]string
		want   []v1.ServerState
	}{
		{name: "from the start", path: path,
			want: []v1.ServerState{"pending", "placing", "creating", "failed"}},
		{name: "after Last-Event-ID", path: path, header: map[string]string{HeaderLastEventID: "2-0"},
			want: []v1.ServerState{"creating", "failed"}},
		{name: "after lastEventId query", path: path + "?lastEventId=3-0",
			want: []v1.ServerState{"failed"}},
		{name: "the header wins over the query", path: path + "?lastEventId=1-0", header: map[string]string{HeaderLastEventID: "3-0"},
			want: []v1.ServerState{"failed"}},
		{name: "nothing after the terminal event", path: path, header: map[string]string{HeaderLastEventID: "4-0"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			seedAlice(t, h)
			lifecycle(h, "placing", "creating", "failed")
			rec := h.do(t, req{method: "GET", path: tc.path, token: tokAlice, header: tc.header})
			if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "text/event-stream" {
				t.Fatalf("status %d, Content-Type %q: %s", rec.Code, rec.Header().Get("Content-Type"), rec.Body)
			}
			if diff := cmp.Diff(tc.want, states(t, readAll(t, rec.Body.String()))); diff != "" {
				t.Errorf("states (-want +got):\n%s", diff)
			}
		})
	}
}

// TestEventsReplayRunsIntoANewSpawn: a stopped spawn followed by a new one
// is not the end; the stream follows the latest spawn.
func TestEventsReplayRunsIntoANewSpawn(t *testing.T) {
	h := newHarness(t)
	seedAlice(t, h)
	lifecycle(h, "stopping", "stopped", "pending", "placing", "failed")
	rec := h.do(t, req{method: "GET", path: "/api/v1/users/alice/servers/nb/events", token: tokAlice})
	want := []v1.ServerState{"pending", "stopping", "stopped", "pending", "placing", "failed"}
	if diff := cmp.Diff(want, states(t, readAll(t, rec.Body.String()))); diff != "" {
		t.Errorf("states (-want +got):\n%s", diff)
	}
}

// openStream starts GET .../events on a real HTTP server and returns a
// reader; the stream is closed when the test ends.
func openStream(t *testing.T, ctx context.Context, srv *httptest.Server, lastID string) *sseReader {
	t.Helper()
	r, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/api/v1/users/alice/servers/nb/events", nil)
	if err != nil {
		t.Fatal(err)
	}
	r.Header.Set("Authorization", "Bearer "+tokAlice)
	if lastID != "" {
		r.Header.Set(HeaderLastEventID, lastID)
	}
	resp, err := srv.Client().Do(r)
	if err != nil {
		t.Fatalf("open stream: %v", err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("open stream: status %d", resp.StatusCode)
	}
	checkContract(t, httptest.NewRequest(r.Method, r.URL.RequestURI(), nil), resp.StatusCode, resp.Header, nil)
	return &sseReader{bufio.NewReader(resp.Body)}
}

// TestEventsFollowLive replays, then follows transitions as they happen,
// and ends by itself after the terminal one.
func TestEventsFollowLive(t *testing.T) {
	h := newHarness(t)
	seedAlice(t, h)
	lifecycle(h, "placing")
	srv := httptest.NewServer(h.e)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	s := openStream(t, ctx, srv, "1-0")

	var got []sseMsg
	read := func() {
		t.Helper()
		m, err := s.next()
		if err != nil {
			t.Fatalf("read: %v (after %v)", err, got)
		}
		got = append(got, m)
	}
	read() // the replayed "placing"
	for _, st := range []v1.ServerState{"creating", "starting", "running", "stopping", "stopped"} {
		lifecycle(h, st)
		read()
	}
	if m, err := s.next(); !errors.Is(err, io.EOF) {
		t.Fatalf("after stopped: %+v, %v; want the stream to end", m, err)
	}
	want := []v1.ServerState{"placing", "creating", "starting", "running", "stopping", "stopped"}
	if diff := cmp.Diff(want, states(t, got)); diff != "" {
		t.Errorf("states (-want +got):\n%s", diff)
	}
	if got[0].ID != "2-0" || got[len(got)-1].ID != "7-0" {
		t.Errorf("ids %q..%q, want 2-0..7-0", got[0].ID, got[len(got)-1].ID)
	}
	// Only the read after stopped does not wait; the replay of a live
	// server and every live event came through the blocking read (the
	// streams' own Redis pool), one read per stream fewer.
	h.servers.mu.Lock()
	defer h.servers.mu.Unlock()
	if h.servers.unblocked != 1 {
		t.Errorf("%d reads without waiting, want 1 (after the terminal event)", h.servers.unblocked)
	}
}

// TestEventsKeepaliveAndWriteTimeout: with nothing happening the stream
// writes keepalive comments, outlives the server's WriteTimeout, and the
// handler returns when the client goes away (goleak checks the rest).
func TestEventsKeepaliveAndWriteTimeout(t *testing.T) {
	const writeTimeout = 300 * time.Millisecond
	h := newHarness(t, harnessConfig{opts: []Option{WithEventsBlock(20 * time.Millisecond)}})
	seedAlice(t, h)
	lifecycle(h, "placing", "creating", "starting", "running")
	srv := httptest.NewUnstartedServer(h.e)
	srv.Config.WriteTimeout = writeTimeout
	srv.Start()
	defer srv.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	s := openStream(t, ctx, srv, "5-0")

	start := time.Now()
	keepalives := 0
	for time.Since(start) < 2*writeTimeout {
		m, err := s.next()
		if err != nil {
			t.Fatalf("stream cut after %v and %d keepalives: %v", time.Since(start), keepalives, err)
		}
		if m.Comment != "keepalive" {
			t.Fatalf("got %+v, want a keepalive", m)
		}
		keepalives++
	}
	// Still alive past the WriteTimeout: an event goes through.
	lifecycle(h, "stopping")
	for {
		m, err := s.next()
		if err != nil {
			t.Fatalf("read after WriteTimeout: %v", err)
		}
		if m.Comment == "" {
			if diff := cmp.Diff([]v1.ServerState{"stopping"}, states(t, []sseMsg{m})); diff != "" {
				t.Errorf("states (-want +got):\n%s", diff)
			}
			break
		}
	}
	cancel() // the client goes away; srv.Close waits for the handler
}

// TestEventsEndWhenTheBrokerDrains: closing the drain channel (WithDrain)
// ends a following stream cleanly (no error event, end of stream), while
// other requests are still answered.
func TestEventsEndWhenTheBrokerDrains(t *testing.T) {
	drain := make(chan struct{})
	h := newHarness(t, harnessConfig{opts: []Option{WithEventsBlock(20 * time.Millisecond), WithDrain(drain)}})
	seedAlice(t, h)
	lifecycle(h, "placing", "creating", "starting", "running")
	srv := httptest.NewServer(h.e)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	s := openStream(t, ctx, srv, "5-0")
	if m, err := s.next(); err != nil || m.Comment != "keepalive" {
		t.Fatalf("got %+v, %v; want a keepalive from a following stream", m, err)
	}
	close(drain)
	for {
		m, err := s.next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("after the drain: %v, want the end of the stream", err)
		}
		if m.Comment != "keepalive" {
			t.Fatalf("after the drain: %+v, want only keepalives, then the end of the stream", m)
		}
	}
	if rec := h.do(t, req{method: http.MethodGet, path: "/api/v1/users/alice/servers/nb", token: tokAlice}); rec.Code != http.StatusOK {
		t.Errorf("get after the drain: status %d, want 200: %s", rec.Code, rec.Body)
	}
}

// TestEventsFailureEndsTheStream: a failure after the stream started ends
// it with an error event chosen by the error table.
func TestEventsFailureEndsTheStream(t *testing.T) {
	h := newHarness(t, harnessConfig{opts: []Option{WithEventsBlock(10 * time.Millisecond)}})
	seedAlice(t, h)
	srv := httptest.NewServer(h.e)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	s := openStream(t, ctx, srv, "")
	if m, err := s.next(); err != nil || m.Event != "state" {
		t.Fatalf("first message %+v, %v", m, err)
	}
	h.servers.failOn("events", errBoom)
	for {
		m, err := s.next()
		if err != nil {
			t.Fatalf("stream ended without an error event: %v", err)
		}
		if m.Comment != "" {
			continue
		}
		var e v1.Error
		if m.Event != "error" || json.Unmarshal([]byte(m.Data), &e) != nil || e.Code != v1.CodeInternal || strings.Contains(e.Message, "10.0.0.7") {
			t.Fatalf("got %+v, want an internal error event", m)
		}
		break
	}
	if _, err := s.next(); !errors.Is(err, io.EOF) {
		t.Errorf("after the error event: %v, want the end", err)
	}
}
