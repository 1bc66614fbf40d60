package reclaim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

// Activity is what a Jupyter server reports about itself through
// /api/status, /api/kernels and /api/terminals.
type Activity struct {
	// Kernels is the number of kernels; BusyKernels those whose
	// execution_state is "busy" (running code, possibly silently) or
	// "starting" (the server has no status from the kernel yet).
	Kernels, BusyKernels int
	// Terminals is the number of terminals.
	Terminals int
	// Connections is the number of client connections the server counts.
	Connections int
	// LastActivity is the latest last_activity of the server, its kernels
	// and its terminals (UTC); zero when none was reported.
	LastActivity time.Time
}

// Prober asks a notebook server for its activity. Safe for concurrent use.
type Prober struct {
	client  *http.Client
	timeout time.Duration
	target  Target
}

// Target finds where a running server's notebook API is (its base URL,
// with the notebook's own path prefix) and the token it accepts ("" sends
// none). An error makes the probe fail with it (unknown, never idle).
type Target func(ctx context.Context, s fleet.Server) (base, token string, err error)

// NewProber returns a Prober that uses client with timeout per probe (0
// means 5 s). nil client means http.DefaultClient. target locates each
// server's notebook and its token; nil probes the server's URL as it is,
// without a token.
func NewProber(client *http.Client, timeout time.Duration, target Target) *Prober {
	if client == nil {
		client = http.DefaultClient
	}
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	if target == nil {
		target = func(_ context.Context, s fleet.Server) (string, string, error) { return s.URL, "", nil }
	}
	return &Prober{client: client, timeout: timeout, target: target}
}

// errProbe marks a failed probe; its text is the readable reason.
var errProbe = errors.New("notebook activity probe failed")

// Probe reads the activity of server s's notebook at its target (e.g.
// "http://10.0.0.7:8888/user/ada/nb/") with the target's token
// ("Authorization: token ..."). Every request carries
// no_track_activity=1 so the probe itself is not activity. Any failure (no
// target or token, no URL, transport error, non-200 answer, malformed JSON)
// is an error that wraps errProbe and says what failed; callers treat it
// as "unknown".
func (p *Prober) Probe(ctx context.Context, s fleet.Server) (Activity, error) {
	base, token, err := p.target(ctx, s)
	if err != nil {
		return Activity{}, fmt.Errorf("%w: %w", errProbe, err)
	}
	if base == "" {
		return Activity{}, fmt.Errorf("%w: the server has no URL", errProbe)
	}
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return Activity{}, fmt.Errorf("%w: bad server URL %q", errProbe, base)
	}
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	var a Activity
	later := func(s string) {
		if t, err := time.Parse(time.RFC3339Nano, s); err == nil && t.After(a.LastActivity) {
			a.LastActivity = t.UTC()
		}
	}
	var status struct {
		LastActivity string `json:"last_activity"`
		Connections  int    `json:"connections"`
	}
	if err := p.get(ctx, u, token, "api/status", &status); err != nil {
		return Activity{}, err
	}
	later(status.LastActivity)
	a.Connections = status.Connections
	var kernels []struct {
		LastActivity   string `json:"last_activity"`
		ExecutionState string `json:"execution_state"`
	}
	if err := p.get(ctx, u, token, "api/kernels", &kernels); err != nil {
		return Activity{}, err
	}
	a.Kernels = len(kernels)
	for _, k := range kernels {
		later(k.LastActivity)
		// "starting" is what the notebook server says until it has seen a
		// status message from the kernel; it can miss the first ones (its
		// socket subscribes after the kernel starts) and then say
		// "starting" while a cell runs. Not knowing is never idle.
		if k.ExecutionState == "busy" || k.ExecutionState == "starting" {
			a.BusyKernels++
		}
	}
	var terminals []struct {
		LastActivity string `json:"last_activity"`
	}
	if err := p.get(ctx, u, token, "api/terminals", &terminals); err != nil {
		return Activity{}, err
	}
	a.Terminals = len(terminals)
	for _, t := range terminals {
		later(t.LastActivity)
	}
	return a, nil
}

// get fetches base/path?no_track_activity=1 into v, with token when set.
func (p *Prober) get(ctx context.Context, base *url.URL, token, path string, v any) error {
	u := *base
	u.Path = strings.TrimSuffix(u.Path, "/") + "/" + path
	u.RawQuery = "no_track_activity=1"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return fmt.Errorf("%w: %s: %w", errProbe, path, err)
	}
	req.Header.Set("Accept", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "token "+token)
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return fmt.Errorf("%w: %s: %w", errProbe, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return fmt.Errorf("%w: %s answered %s", errProbe, path, resp.Status)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(v); err != nil {
		return fmt.Errorf("%w: %s: malformed answer: %w", errProbe, path, err)
	}
	return nil
}
