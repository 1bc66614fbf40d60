package app

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestPprofListenerBindsToLoopbackWithoutAHost(t *testing.T) {
	ln, err := listenPprof(":0")
	if err != nil {
		t.Fatal(err)
	}
	host, _, err := net.SplitHostPort(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if host != "127.0.0.1" {
		t.Errorf("--debug-pprof-listen=:0 bound %s, want 127.0.0.1 (loopback only)", ln.Addr())
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- serveUntil(ctx, "pprof server", newServer(pprofMux(), slog.New(slog.DiscardHandler)), ln, time.Second, slog.New(slog.DiscardHandler))
	}()
	for path, want := range map[string]string{"/debug/pprof/": "goroutine", "/debug/pprof/cmdline": "app.test"} {
		resp, err := http.Get("http://" + ln.Addr().String() + path)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || !strings.Contains(string(body), want) {
			t.Errorf("GET %s: %s, %d bytes (%v), want 200 with %q", path, resp.Status, len(body), err, want)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("pprof server after its context ended: %v", err)
	}
}

func TestNoPprofListenerByDefault(t *testing.T) {
	if err := servePprof(t.Context(), "", slog.New(slog.DiscardHandler), time.Second); err != nil {
		t.Errorf("servePprof with no address = %v, want nil (nothing served)", err)
	}
}
