package frontend

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

// apiError is an API answer of 400 or more, with the API's own words.
type apiError struct {
	Status int
	Body   v1.Error
}

func (e *apiError) Error() string {
	return fmt.Sprintf("api: %d %s: %s", e.Status, e.Body.Code, e.Body.Message)
}

// apiClient calls the broker's REST API in-process, as the browser that
// made the page request: with its cookie, and with the session's CSRF
// token on writes.
type apiClient struct {
	h http.Handler
}

// maxAPIBytes bounds an in-process answer.
const maxAPIBytes = 8 << 20

// call sends method path (path already escaped) with body as JSON (nil:
// none) and decodes a 2xx answer into out (nil: ignored). Answers of 400
// or more are an *apiError.
func (c apiClient) call(ctx context.Context, from *http.Request, v Viewer, method, path string, header http.Header, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("api %s %s: encode: %w", method, path, err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, path, rd)
	if err != nil {
		return fmt.Errorf("api %s %s: %w", method, path, err)
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for _, ck := range from.Cookies() {
		req.AddCookie(ck)
	}
	if method != http.MethodGet {
		req.Header.Set(csrfHeader, v.CSRF)
	}
	if req.Body == nil {
		req.Body = http.NoBody // a server-side request always has a body
	}
	req.RemoteAddr = from.RemoteAddr
	req.Host = from.Host
	rec := &recorder{header: http.Header{}}
	c.h.ServeHTTP(rec, req)
	status := rec.status
	if status == 0 {
		status = http.StatusOK
	}
	if rec.overflow {
		return fmt.Errorf("api %s %s: answer larger than %d bytes", method, path, maxAPIBytes)
	}
	if status >= 400 {
		ae := &apiError{Status: status}
		if err := json.Unmarshal(rec.body.Bytes(), &ae.Body); err != nil || ae.Body.Message == "" {
			ae.Body = v1.Error{Code: v1.CodeInternal, Message: http.StatusText(status)}
		}
		return ae
	}
	if out != nil {
		if err := json.Unmarshal(rec.body.Bytes(), out); err != nil {
			return fmt.Errorf("api %s %s: decode: %w", method, path, err)
		}
	}
	return nil
}

// recorder is the in-process ResponseWriter of apiClient.
type recorder struct {
	header   http.Header
	status   int
	body     bytes.Buffer
	overflow bool
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	if r.body.Len()+len(p) > maxAPIBytes {
		r.overflow = true
		return 0, fmt.Errorf("frontend: api answer larger than %d bytes", maxAPIBytes)
	}
	return r.body.Write(p)
}

// serverPath is the API path of user's server name.
func serverPath(user, name string) string {
	return "/api/v1/users/" + url.PathEscape(user) + "/servers/" + url.PathEscape(name)
}

func (c apiClient) profiles(ctx context.Context, r *http.Request, v Viewer) ([]v1.Profile, error) {
	var out []v1.Profile
	return out, c.call(ctx, r, v, http.MethodGet, "/api/v1/profiles", nil, nil, &out)
}

func (c apiClient) servers(ctx context.Context, r *http.Request, v Viewer) ([]v1.Server, error) {
	return c.serverPages(ctx, r, v, "/api/v1/users/"+url.PathEscape(v.User)+"/servers", url.Values{})
}

func (c apiClient) allServers(ctx context.Context, r *http.Request, v Viewer) ([]v1.Server, error) {
	return c.serverPages(ctx, r, v, "/api/v1/servers", url.Values{"all": {"true"}})
}

// maxListPages bounds how many pages of servers a page reads (at 1000
// each).
const maxListPages = 20

// serverPages reads every page of a server list.
func (c apiClient) serverPages(ctx context.Context, r *http.Request, v Viewer, path string, q url.Values) ([]v1.Server, error) {
	out := []v1.Server{}
	q.Set("limit", "1000")
	for range maxListPages {
		var page v1.ServerPage
		if err := c.call(ctx, r, v, http.MethodGet, path+"?"+q.Encode(), nil, nil, &page); err != nil {
			return nil, err
		}
		out = append(out, page.Servers...)
		if page.Next == "" {
			return out, nil
		}
		q.Set("cursor", page.Next)
	}
	return out, nil
}

func (c apiClient) server(ctx context.Context, r *http.Request, v Viewer, name string) (v1.Server, error) {
	return c.serverOf(ctx, r, v, v.User, name)
}

// serverOf reads user's server name (an admin may read anyone's).
func (c apiClient) serverOf(ctx context.Context, r *http.Request, v Viewer, user, name string) (v1.Server, error) {
	var out v1.Server
	return out, c.call(ctx, r, v, http.MethodGet, serverPath(user, name), nil, nil, &out)
}

func (c apiClient) create(ctx context.Context, r *http.Request, v Viewer, name, idem string, req v1.CreateServerRequest) (v1.Server, error) {
	var out v1.Server
	h := http.Header{}
	if idem != "" {
		h.Set("Idempotency-Key", idem)
	}
	return out, c.call(ctx, r, v, http.MethodPut, serverPath(v.User, name), h, req, &out)
}

func (c apiClient) stop(ctx context.Context, r *http.Request, v Viewer, name string) error {
	return c.call(ctx, r, v, http.MethodDelete, serverPath(v.User, name), nil, nil, nil)
}

// remove removes a stopped or failed server.
func (c apiClient) remove(ctx context.Context, r *http.Request, v Viewer, name string) error {
	return c.call(ctx, r, v, http.MethodDelete, serverPath(v.User, name)+"?remove=true", nil, nil, nil)
}

// quota reads the viewer's caps and their use.
func (c apiClient) quota(ctx context.Context, r *http.Request, v Viewer) (v1.Quota, error) {
	var out v1.Quota
	return out, c.call(ctx, r, v, http.MethodGet, "/api/v1/users/"+url.PathEscape(v.User)+"/quota", nil, nil, &out)
}

func (c apiClient) gpus(ctx context.Context, r *http.Request, v Viewer) ([]v1.GPUStatus, error) {
	var out []v1.GPUStatus
	return out, c.call(ctx, r, v, http.MethodGet, "/api/v1/admin/gpus", nil, nil, &out)
}

func (c apiClient) policy(ctx context.Context, r *http.Request, v Viewer) (v1.ReclaimPolicy, error) {
	var out v1.ReclaimPolicy
	return out, c.call(ctx, r, v, http.MethodGet, "/api/v1/admin/reclaim-policy", nil, nil, &out)
}

// previewPolicy asks what the reclaimer would do now under p (unsaved).
func (c apiClient) previewPolicy(ctx context.Context, r *http.Request, v Viewer, p v1.ReclaimPolicy) (v1.ReclaimPreview, error) {
	var out v1.ReclaimPreview
	return out, c.call(ctx, r, v, http.MethodPost, "/api/v1/admin/reclaim-policy/preview", nil, p, &out)
}

// putPolicy saves p, or with validate only checks it (nothing is saved).
func (c apiClient) putPolicy(ctx context.Context, r *http.Request, v Viewer, p v1.ReclaimPolicy, validate bool) (v1.ReclaimPolicy, error) {
	var out v1.ReclaimPolicy
	path := "/api/v1/admin/reclaim-policy"
	if validate {
		path += "?validate=true"
	}
	return out, c.call(ctx, r, v, http.MethodPut, path, nil, p, &out)
}

func (c apiClient) audit(ctx context.Context, r *http.Request, v Viewer, q url.Values) (v1.AuditPage, error) {
	var out v1.AuditPage
	return out, c.call(ctx, r, v, http.MethodGet, "/api/v1/admin/audit?"+q.Encode(), nil, nil, &out)
}
