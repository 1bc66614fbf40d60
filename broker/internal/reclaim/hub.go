package reclaim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Hub posts server activity to JupyterHub's activity API
// (POST /hub/api/users/{user}/activity), so that the hub's idle culler
// does not stop servers whose GPU is busy. Safe for concurrent use.
type Hub struct {
	base   *url.URL
	token  string
	client *http.Client
}

var _ HubNotifier = (*Hub)(nil)

// NewHub returns a Hub for the hub at baseURL (e.g.
// "http://hub:8081/"), authenticating with token (a hub API token with the
// users:activity scope) through client (nil means http.DefaultClient).
func NewHub(baseURL, token string, client *http.Client) (*Hub, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("reclaim: hub url %q: want http(s)://host[:port]/", baseURL)
	}
	if token == "" {
		return nil, errors.New("reclaim: hub api token is empty")
	}
	if client == nil {
		client = http.DefaultClient
	}
	return &Hub{base: u, token: token, client: client}, nil
}

// Activity reports that user's server (name "" = the default server) was
// active at at. Errors name the user and server and the hub's answer.
func (h *Hub) Activity(ctx context.Context, user, server string, at time.Time) error {
	ts := at.UTC().Format("2006-01-02T15:04:05.000Z")
	body, err := json.Marshal(map[string]any{
		"last_activity": ts,
		"servers":       map[string]any{server: map[string]string{"last_activity": ts}},
	})
	if err != nil {
		return fmt.Errorf("hub activity of %s: %w", user, err)
	}
	u := *h.base
	// Path and RawPath together keep a user name with "/" or "%" one
	// path segment.
	rawBase := strings.TrimSuffix(u.EscapedPath(), "/")
	u.Path = strings.TrimSuffix(u.Path, "/") + "/hub/api/users/" + user + "/activity"
	u.RawPath = rawBase + "/hub/api/users/" + url.PathEscape(user) + "/activity"
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("hub activity of %s/%s: %w", user, server, err)
	}
	req.Header.Set("Authorization", "token "+h.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := h.client.Do(req)
	if err != nil {
		return fmt.Errorf("hub activity of %s/%s: %w", user, server, err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("hub activity of %s/%s: hub answered %s: %s", user, server, resp.Status, strings.TrimSpace(string(msg)))
	}
	return nil
}
