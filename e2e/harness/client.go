package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

// APIError is a non-2xx answer of the broker. Body is the decoded v1.Error;
// Raw is the body as received (at most 8 MiB), for answers that are not
// JSON; Header holds the answer's headers.
type APIError struct {
	Status int
	Body   v1.Error
	Raw    string
	Header http.Header
}

func (e *APIError) Error() string {
	if e.Body.Code != "" || e.Body.Message != "" {
		return fmt.Sprintf("HTTP %d %s: %s", e.Status, e.Body.Code, e.Body.Message)
	}
	return fmt.Sprintf("HTTP %d: %q", e.Status, e.Raw)
}

// Client calls the broker's REST API with one bearer token. The zero Token
// sends no Authorization header. It is safe for concurrent use.
type Client struct {
	// BaseURL is the broker's base URL, without /api/v1.
	BaseURL string
	// Token is the bearer token sent with every request; "" sends none.
	Token string
	// HTTP is the client used; nil means a client with a 30 s timeout.
	HTTP *http.Client
}

var defaultHTTP = &http.Client{Timeout: 30 * time.Second}

// maxBody is the most of an answer Do reads: enough for an admin's list of
// every server of a busy test.
const maxBody = 8 << 20

// Do sends a request with an optional JSON body and header, decodes a 2xx
// JSON answer into out (when not nil) and returns the status. A non-2xx
// answer is returned as *APIError along with its status.
func (c *Client) Do(ctx context.Context, method, path string, body any, header http.Header, out any) (int, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, fmt.Errorf("%s %s: encode body: %w", method, path, err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.BaseURL+path, rd)
	if err != nil {
		return 0, fmt.Errorf("%s %s: %w", method, path, err)
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	hc := c.HTTP
	if hc == nil {
		hc = defaultHTTP
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return resp.StatusCode, fmt.Errorf("%s %s: read body: %w", method, path, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		ae := &APIError{Status: resp.StatusCode, Raw: string(raw), Header: resp.Header}
		_ = json.Unmarshal(raw, &ae.Body) // Raw keeps what did not decode
		return resp.StatusCode, fmt.Errorf("%s %s: %w", method, path, ae)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return resp.StatusCode, fmt.Errorf("%s %s: decode %q: %w", method, path, raw, err)
		}
	}
	return resp.StatusCode, nil
}

// ServerPath returns /api/v1/users/{user}/servers/{name} with both parts
// path-escaped.
func ServerPath(user, name string) string {
	return "/api/v1/users/" + url.PathEscape(user) + "/servers/" + url.PathEscape(name)
}

// CreateServer sends PUT ServerPath with the Idempotency-Key header and
// returns the server and the status (201 created, 200 replayed).
func (c *Client) CreateServer(ctx context.Context, user, name, idempotencyKey string, req v1.CreateServerRequest) (v1.Server, int, error) {
	var s v1.Server
	h := http.Header{}
	if idempotencyKey != "" {
		h.Set("Idempotency-Key", idempotencyKey)
	}
	status, err := c.Do(ctx, http.MethodPut, ServerPath(user, name), req, h, &s)
	return s, status, err
}

// GetServer sends GET ServerPath.
func (c *Client) GetServer(ctx context.Context, user, name string) (v1.Server, error) {
	var s v1.Server
	_, err := c.Do(ctx, http.MethodGet, ServerPath(user, name), nil, nil, &s)
	return s, err
}

// AllServers lists every server the caller may see (all users' for an
// admin), following the list's pages (GET /api/v1/servers?all=true and
// its cursors) to the last.
func (c *Client) AllServers(ctx context.Context) ([]v1.Server, error) {
	var out []v1.Server
	cursor := ""
	for {
		path := "/api/v1/servers?all=true"
		if cursor != "" {
			path += "&cursor=" + url.QueryEscape(cursor)
		}
		var page v1.ServerPage
		if _, err := c.Do(ctx, http.MethodGet, path, nil, nil, &page); err != nil {
			return nil, err
		}
		out = append(out, page.Servers...)
		if page.Next == "" {
			return out, nil
		}
		cursor = page.Next
	}
}

// DeleteServer sends DELETE ServerPath and returns the status (202 expected).
func (c *Client) DeleteServer(ctx context.Context, user, name string) (int, error) {
	return c.Do(ctx, http.MethodDelete, ServerPath(user, name), nil, nil, nil)
}

// PutGPU registers or updates a GPU through PUT /api/v1/admin/gpus/{uuid}
// (what the node agent does); needs an admin token.
func (c *Client) PutGPU(ctx context.Context, g v1.GPU) error {
	_, err := c.Do(ctx, http.MethodPut, "/api/v1/admin/gpus/"+url.PathEscape(g.UUID), g, nil, nil)
	return err
}

// GPUs lists GET /api/v1/admin/gpus; needs an admin token.
func (c *Client) GPUs(ctx context.Context) ([]v1.GPUStatus, error) {
	var out []v1.GPUStatus
	_, err := c.Do(ctx, http.MethodGet, "/api/v1/admin/gpus", nil, nil, &out)
	return out, err
}

// ErrServerFailed is wrapped by WaitServer when the server reached the
// failed state instead of the one waited for.
var ErrServerFailed = errors.New("server failed")

// WaitServer polls GET ServerPath every 100 ms until the server is in state
// want, up to timeout. It stops early, wrapping ErrServerFailed, when the
// server fails while want is not failed.
func (c *Client) WaitServer(ctx context.Context, user, name string, want v1.ServerState, timeout time.Duration) (v1.Server, error) {
	var last v1.Server
	err := Poll(ctx, 100*time.Millisecond, timeout, func(ctx context.Context) (bool, string, error) {
		s, err := c.GetServer(ctx, user, name)
		if err != nil {
			return false, err.Error(), nil
		}
		last = s
		if s.State == v1.StateFailed && want != v1.StateFailed {
			return false, "", fmt.Errorf("%s/%s: %w: %s", user, name, ErrServerFailed, s.Message)
		}
		return s.State == want, fmt.Sprintf("state %s: %s", s.State, s.Message), nil
	})
	if err != nil {
		return last, fmt.Errorf("wait for %s/%s to be %s: %w", user, name, want, err)
	}
	return last, nil
}
