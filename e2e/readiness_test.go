package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/e2e/harness"
)

// TestReplicaReadinessFollowsItsDependencies takes a broker's API server
// away (a TCP proxy between them cut) and then its Redis (stopped): each
// time /readyz turns 503 naming the dependency, and once the dependency is
// back it turns 200 again by itself, without a restart; after Redis came
// back empty the broker places again once the GPUs are re-registered.
func TestReplicaReadinessFollowsItsDependencies(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	ctx := t.Context()
	u, err := url.Parse(e.cluster.URL)
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := harness.StartTCPProxy(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	e.kubeconfig = proxiedKubeconfig(t, e.cluster.BrokerKubeconfig, "https://"+proxy.Addr)
	b := e.startBroker()
	probe := &harness.Client{BaseURL: b.URL}

	step := func(what string, want map[string]bool) {
		t.Helper()
		start := time.Now()
		var last v1.Readiness
		err := harness.Poll(ctx, 100*time.Millisecond, 60*time.Second, func(ctx context.Context) (bool, string, error) {
			r, status, err := readiness(ctx, probe)
			if err != nil {
				return false, err.Error(), nil
			}
			last = r
			for _, c := range r.Checks {
				if ok, named := want[c.Name]; named && c.OK != ok {
					return false, fmt.Sprintf("%d %+v", status, r.Checks), nil
				}
			}
			allOK := true
			for _, ok := range want {
				allOK = allOK && ok
			}
			return (status == http.StatusOK) == allOK, fmt.Sprintf("%d %+v", status, r.Checks), nil
		})
		if err != nil {
			t.Fatalf("%s: readiness %v", what, err)
		}
		t.Logf("%s: /readyz followed in %s: %s %+v", what, time.Since(start).Round(time.Millisecond), last.Status, last.Checks)
	}

	proxy.Cut()
	step("API server cut off", map[string]bool{"kubernetes": false, "redis": true})
	proxy.Restore()
	step("API server back", map[string]bool{"kubernetes": true, "redis": true})

	e.redis.Stop()
	step("Redis stopped", map[string]bool{"redis": false})
	e.redis.Restart() // on the same port, empty
	step("Redis back", map[string]bool{"kubernetes": true, "redis": true})

	e.registerGPUs() // as the node agents' next heartbeats would
	cl := e.client("alice")
	cl.BaseURL = b.URL
	err = harness.Poll(ctx, 200*time.Millisecond, 30*time.Second, func(ctx context.Context) (bool, string, error) {
		_, _, err := cl.CreateServer(ctx, "alice", "nb", "k-alice-nb", v1.CreateServerRequest{Profile: "small"})
		var ae *harness.APIError
		if errors.As(err, &ae) && ae.Status == http.StatusServiceUnavailable {
			return false, err.Error(), nil // allocations being rebuilt
		}
		return err == nil, "", err
	})
	if err != nil {
		t.Fatalf("create after Redis came back: %v", err)
	}
	if _, err := cl.WaitServer(ctx, "alice", "nb", v1.StateRunning, 60*time.Second); err != nil {
		t.Fatal(err)
	}
}

// readiness reads GET /readyz (200 or 503, both with a v1.Readiness).
func readiness(ctx context.Context, c *harness.Client) (v1.Readiness, int, error) {
	var r v1.Readiness
	status, err := c.Do(ctx, http.MethodGet, "/readyz", nil, nil, &r)
	var ae *harness.APIError
	if errors.As(err, &ae) && ae.Status == http.StatusServiceUnavailable {
		if jerr := json.Unmarshal([]byte(ae.Raw), &r); jerr != nil {
			return r, status, fmt.Errorf("readyz %d: %w", status, jerr)
		}
		return r, status, nil
	}
	return r, status, err
}

// proxiedKubeconfig writes a copy of the kubeconfig at path whose clusters
// are reached at server instead, and returns its path.
func proxiedKubeconfig(t *testing.T, path, server string) string {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cfg.Clusters {
		c.Server = server
	}
	out := filepath.Join(t.TempDir(), "proxied.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, out); err != nil {
		t.Fatal(err)
	}
	return out
}
