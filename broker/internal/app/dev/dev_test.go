package dev

import (
	"errors"
	"flag"
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/gpubroker/gpubroker/broker/internal/config"
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
