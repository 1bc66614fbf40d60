package harness

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

// EventStream reads GET .../events, a server-sent event stream of
// v1.Event. It is not safe for concurrent use; Close ends it.
type EventStream struct {
	body io.ReadCloser
	rd   *bufio.Reader
}

// Events opens the event stream of user's server name, replaying the
// events after lastEventID ("" replays from the start). The stream ends when
// ctx ends, Close is called, or the broker ends it.
func (c *Client) Events(ctx context.Context, user, name, lastEventID string) (*EventStream, error) {
	path := ServerPath(user, name) + "/events"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.BaseURL+path, nil)
	if err != nil {
		return nil, fmt.Errorf("events %s: %w", path, err)
	}
	req.Header.Set("Accept", "text/event-stream")
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	if lastEventID != "" {
		req.Header.Set("Last-Event-ID", lastEventID)
	}
	// No client timeout: the stream is long-lived; ctx bounds it. The
	// client's own transport, when it has one, keeps its connection pool.
	rt := http.DefaultTransport
	if c.HTTP != nil && c.HTTP.Transport != nil {
		rt = c.HTTP.Transport
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return nil, fmt.Errorf("events %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		ae := &APIError{Status: resp.StatusCode, Raw: string(raw), Header: resp.Header}
		_ = json.Unmarshal(raw, &ae.Body)
		return nil, fmt.Errorf("events %s: %w", path, ae)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		resp.Body.Close()
		return nil, fmt.Errorf("events %s: content type %q, want text/event-stream", path, ct)
	}
	return &EventStream{body: resp.Body, rd: bufio.NewReader(resp.Body)}, nil
}

// Next returns the next state event, skipping comments. It returns io.EOF
// when the broker ended the stream, and an error wrapping *APIError for an
// `event: error`. A state event's SSE id must equal the JSON's id.
func (s *EventStream) Next() (v1.Event, error) {
	var id, event, data string
	for {
		line, err := s.rd.ReadString('\n')
		if err != nil {
			if errors.Is(err, io.EOF) && id == "" && data == "" {
				return v1.Event{}, io.EOF
			}
			return v1.Event{}, fmt.Errorf("read event stream: %w", err)
		}
		line = strings.TrimRight(line, "\r\n")
		switch {
		case line == "":
			if data == "" {
				id, event = "", ""
				continue // a comment block or keepalive
			}
			if event == "error" {
				ae := &APIError{Raw: data}
				_ = json.Unmarshal([]byte(data), &ae.Body)
				return v1.Event{}, fmt.Errorf("event stream error: %w", ae)
			}
			var ev v1.Event
			if err := json.Unmarshal([]byte(data), &ev); err != nil {
				return v1.Event{}, fmt.Errorf("decode event %q: %w", data, err)
			}
			if ev.ID != id {
				return ev, fmt.Errorf("event id field %q differs from its JSON id %q", id, ev.ID)
			}
			return ev, nil
		case strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "id:"):
			id = strings.TrimSpace(strings.TrimPrefix(line, "id:"))
		case strings.HasPrefix(line, "event:"):
			event = strings.TrimSpace(strings.TrimPrefix(line, "event:"))
		case strings.HasPrefix(line, "data:"):
			data += strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " ")
		}
	}
}

// Close ends the stream.
func (s *EventStream) Close() error { return s.body.Close() }
