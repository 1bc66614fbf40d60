package dev

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/app"
	"github.com/gpubroker/gpubroker/broker/internal/config"
	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
	"github.com/gpubroker/gpubroker/limiter/cliconfig"
	"github.com/gpubroker/gpubroker/limiter/cliconfig/cliconfigtest"
)

var update = flag.Bool("update", false, "rewrite the README's configuration table")

func TestLoadDevDefaultsAndGPUs(t *testing.T) {
	c, warnings, err := Load(nil, nil)
	if err != nil || len(warnings) > 0 {
		t.Fatalf("Load with nothing set: %v (warnings %q); dev mode needs nothing", err, warnings)
	}
	if c.GPUs != 8 || c.Broker.Mode != config.ModeDev || c.Broker.LogFormat != "text" || c.Broker.Listen != ":8080" {
		t.Errorf("defaults: %d GPUs, mode %q, log %q, listen %q; want 8, dev, text, :8080", c.GPUs, c.Broker.Mode, c.Broker.LogFormat, c.Broker.Listen)
	}
	c, _, err = Load(nil, []string{"GPUBROKER_DEV_GPUS=2"})
	if err != nil || c.GPUs != 2 {
		t.Errorf("GPUBROKER_DEV_GPUS=2: %d GPUs, %v", c.GPUs, err)
	}
	_, _, err = Load([]string{"--dev-gpus=65", "--oidc-issuer=http://127.0.0.1:5556"}, []string{"GPUBROKER_DEV_GPUS=x"})
	want := []string{
		"--oidc-audience (GPUBROKER_OIDC_AUDIENCE): is required in serve mode and whenever --oidc-issuer is set",
		"--dev-gpus (GPUBROKER_DEV_GPUS): must be 1..64, got 65",
	}
	if err == nil || err.Error() != strings.Join(want, "\n") {
		t.Errorf("Load = %v, want:\n%s", err, strings.Join(want, "\n"))
	}
	if _, _, err := Load([]string{"--help"}, nil); !errors.Is(err, cliconfig.ErrHelp) {
		t.Errorf("--help: %v", err)
	}
	if u := Usage(); !strings.HasPrefix(u, "Usage: gpubroker-dev [flags]") || !strings.Contains(u, "  --dev-gpus N\n") || !strings.Contains(u, "  --redis-url URL\n") {
		t.Errorf("usage lacks its name, --dev-gpus or the broker's flags:\n%s", u)
	}
}

// TestREADMEDevFlagsAreTheFlagTable keeps the README's table of the flags
// gpubroker-dev adds to the broker's equal to them.
func TestREADMEDevFlagsAreTheFlagTable(t *testing.T) {
	var c Config
	all := c.Table()
	broker := config.Config{Mode: config.ModeDev}
	own := *all
	own.Flags = all.Flags[len(broker.Table().Flags):]
	cliconfigtest.CheckMarkdown(t, "../../../../README.md", "gpubroker-dev", &own, *update)
}

func TestDevPublicURL(t *testing.T) {
	tests := []struct {
		name, public, listen, want string
	}{
		{"configured wins", "https://gpu.example", "127.0.0.1:0", "https://gpu.example"},
		{"loopback listener", "", "127.0.0.1:0", "http://127.0.0.1:"},
		{"unspecified host becomes localhost", "", ":0", "http://localhost:"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", tc.listen)
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			got := devPublicURL(tc.public, ln)
			if !strings.HasPrefix(got, tc.want) {
				t.Errorf("devPublicURL = %q, want prefix %q", got, tc.want)
			}
		})
	}
}

// TestBannerURLsUseLocalhost builds dev mode on a listener for every
// address (":0", as the default ":8080") and checks that the banner's URLs
// are ones a person can open: localhost, never [::].
func TestBannerURLsUseLocalhost(t *testing.T) {
	c, _, err := Load(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var banner strings.Builder
	in, err := build(t.Context(), c, slog.New(slog.DiscardHandler), ln, &banner)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for i := len(in.Closers) - 1; i >= 0; i-- {
			in.Closers[i]()
		}
	}()
	in.Started()
	out := banner.String()
	if strings.Contains(out, "[::]") || strings.Contains(out, "0.0.0.0") || !strings.Contains(out, "API:      http://localhost:") ||
		!strings.Contains(out, "Web:      http://localhost:") || !strings.Contains(out, "curl -sS -X PUT") {
		t.Errorf("banner:\n%s", out)
	}
}

// TestResizeIsAppliedByTheNodeAgent runs dev mode whole (simulated pods),
// starts a server, grows its memory and waits, up to a deadline, for the
// node agent to acknowledge the new quota, then shrinks it back: a memory
// shrink needs a fresh usage sample from the agent, so it proves the
// samples flow too. Without a node agent in dev mode, the growth stays
// pending forever and the shrink is refused (409, memory use unknown).
func TestResizeIsAppliedByTheNodeAgent(t *testing.T) {
	c, _, err := Load([]string{"--listen=127.0.0.1:0", "--dev-gpus=1", "--dev-notebooks=simulated"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", c.Broker.Listen)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	var banner strings.Builder
	in, err := build(t.Context(), c, log, ln, &banner)
	if err != nil {
		ln.Close()
		t.Fatal(err)
	}
	ready := make(chan struct{})
	started := in.Started
	in.Started = func() { started(); close(ready) }
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- app.Run(ctx, c.Broker, log, ln, in) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("app.Run: %v", err)
		}
	}()
	deadline := time.After(60 * time.Second)
	select {
	case <-ready:
	case err := <-done:
		done <- err
		t.Fatalf("dev mode stopped before it started: %v", err)
	case <-deadline:
		t.Fatal("dev mode did not start within 60 s")
	}
	m := regexp.MustCompile(`Bearer ([^']+)'`).FindStringSubmatch(banner.String())
	if m == nil {
		t.Fatalf("no token in the banner:\n%s", banner.String())
	}
	profile := ""
	for _, p := range in.Catalog.Profiles() {
		if p.Sharing == "" || p.Sharing == v1.SharingSliced {
			profile = p.Name
			break
		}
	}
	if profile == "" {
		t.Fatal("the default catalog has no time-sliced profile")
	}
	base := "http://" + ln.Addr().String() + "/api/v1/users/dev/servers/demo"
	call := func(method, url, body string, out any) int {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), method, url, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+m[1])
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		if out != nil && resp.StatusCode < 300 {
			if err := json.Unmarshal(b, out); err != nil {
				t.Fatalf("%s %s: %v in %s", method, url, err, b)
			}
		} else if resp.StatusCode >= 300 {
			t.Logf("%s %s: %d %s", method, url, resp.StatusCode, b)
		}
		return resp.StatusCode
	}
	if code := call(http.MethodPut, base, `{"profile":"`+profile+`"}`, nil); code >= 300 {
		t.Fatalf("create the server: %d", code)
	}
	var srv v1.Server
	for srv.State != v1.StateRunning {
		if code := call(http.MethodGet, base, "", &srv); code != http.StatusOK {
			t.Fatalf("get the server: %d", code)
		}
		select {
		case <-deadline:
			t.Fatalf("the server is %s after 60 s, not running", srv.State)
		case <-time.After(20 * time.Millisecond):
		}
	}

	agents := agentstore.New(in.Redis, c.Broker.Redis.Prefix)
	applied := func(what string, res v1.ResizeResult) {
		t.Helper()
		for !res.Applied {
			a, err := agents.AppliedQuota(t.Context(), srv.SpawnID)
			if err == nil && a.Generation >= res.Generation {
				return
			}
			select {
			case <-deadline:
				t.Fatalf("%s: generation %d not applied by the node agent within 60 s (applied: %+v, %v)", what, res.Generation, a, err)
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	var grown v1.ResizeResult
	if code := call(http.MethodPatch, base+"/slice", fmt.Sprintf(`{"memoryMiB":%d}`, srv.Slice.MemoryMiB*2), &grown); code != http.StatusOK && code != http.StatusAccepted {
		t.Fatalf("grow: %d", code)
	}
	applied("grow", grown)

	var shrunk v1.ResizeResult
	for {
		code := call(http.MethodPatch, base+"/slice", fmt.Sprintf(`{"memoryMiB":%d}`, srv.Slice.MemoryMiB), &shrunk)
		if code == http.StatusOK || code == http.StatusAccepted {
			break
		}
		if code != http.StatusConflict { // 409 until the agent's first sample
			t.Fatalf("shrink: %d", code)
		}
		select {
		case <-deadline:
			t.Fatal("shrink: refused for 60 s; the node agent wrote no usage sample")
		case <-time.After(100 * time.Millisecond):
		}
	}
	applied("shrink", shrunk)
	sample, err := agents.LatestSample(t.Context(), srv.SpawnID)
	// The usage chart shows samples with both readings; the simulated GPU
	// is idle.
	if err != nil || sample.MemoryUsedMiB == nil || *sample.MemoryUsedMiB != 0 || sample.SMPercent == nil || *sample.SMPercent != 0 {
		t.Errorf("latest sample of the idle simulated GPU: %+v, %v; want 0 MiB used and 0 %% SM", sample, err)
	}
}
