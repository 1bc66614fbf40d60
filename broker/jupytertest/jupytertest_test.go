package jupytertest_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gpubroker/gpubroker/broker/jupytertest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRunsCodeOnARealKernel starts a notebook server under a base URL,
// refuses a request without its token, and runs a cell over the kernel
// WebSocket; a silent long cell leaves the kernel busy.
func TestRunsCodeOnARealKernel(t *testing.T) {
	s := jupytertest.Start(t, jupytertest.Options{Base: "/user/ada/nb/"})
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	anon := jupytertest.Client{Base: s.URL}
	var se *jupytertest.StatusError
	if _, err := anon.Kernels(ctx); !errors.As(err, &se) || se.Status != http.StatusForbidden {
		t.Errorf("kernels without the token: %v, want 403", err)
	}
	c := jupytertest.ForServer(s)
	id, err := c.StartKernel(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.Execute(ctx, id, "print(6*7)", true)
	if err != nil || strings.TrimSpace(out) != "42" {
		t.Fatalf("print(6*7): %q, %v", out, err)
	}
	if _, err := c.Execute(ctx, id, "import time; time.sleep(600)", false); err != nil {
		t.Fatal(err)
	}
	// The kernel reports busy once it has taken the request, which the
	// send does not wait for: wait for that state (within ctx's deadline).
	// A server whose kernel socket subscribed after the kernel's first
	// status messages says "starting" for as long as it runs, the cells too
	// (seen in a loaded full run); the reclaimer's probe counts that as busy
	// as well (reclaim/probe.go), so it is what a silent cell shows then.
	for {
		ks, err := c.Kernels(ctx)
		if err == nil && len(ks) == 1 && (ks[0].ExecutionState == "busy" || ks[0].ExecutionState == "starting") {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("kernels during a silent cell: %+v, %v; want one busy", ks, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
