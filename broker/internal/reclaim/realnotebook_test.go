package reclaim_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/internal/reclaim"
	"github.com/gpubroker/gpubroker/broker/internal/redisstore"
	"github.com/gpubroker/gpubroker/broker/jupytertest"
)

// TestReclaimOnRealNotebooks runs the reclaimer with a fake clock against
// real Jupyter notebook servers (Debian's notebook 6.4) probed with their
// own token under their base URL, as the broker probes the pods it runs:
// a kernel busy with a silent cell keeps the server while the GPU is idle;
// a notebook without kernels on an idle GPU is warned and then stopped
// once the window has passed; a notebook refusing the probe is unknown,
// never reclaimed, with the notebook's answer as the reason the admin sees.
func TestReclaimOnRealNotebooks(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		setup func(ctx context.Context, t *testing.T, c jupytertest.Client)
		token func(s *jupytertest.Server) string // what the broker holds as the spawn's token
		want  outcome
		inWhy string
	}{
		{name: "a busy silent cell keeps it", setup: func(ctx context.Context, t *testing.T, c jupytertest.Client) {
			id, err := c.StartKernel(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.Execute(ctx, id, "import time; time.sleep(3600)", false); err != nil {
				t.Fatal(err)
			}
			// The server learns the kernel's state from its status
			// messages, a moment after Execute saw busy (or never, if it
			// missed them: then it says starting, which counts as busy).
			waitKernelState(ctx, t, c, "busy", "starting")
		}, want: outcome{State: v1.StateRunning, Verdict: reclaim.VerdictActive, Reason: "a kernel is running code"}},
		{name: "no kernels and an idle GPU: warned, then stopped",
			want: outcome{State: v1.StateStopped, Verdict: reclaim.VerdictIdle, Audits: 2, Stops: 1}},
		{name: "a refused probe is unknown and kept", token: func(*jupytertest.Server) string { return "not-the-notebooks-token" },
			want: outcome{State: v1.StateRunning, Verdict: reclaim.VerdictUnknown}, inWhy: "api/status answered 403 Forbidden"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			nb := jupytertest.Start(t, jupytertest.Options{Base: "/user/ada/nb/"})
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			if tc.setup != nil {
				tc.setup(ctx, t, jupytertest.ForServer(nb))
			}
			token := nb.Token
			if tc.token != nil {
				token = tc.token(nb)
			}
			f := newFixture(t)
			// The notebook reports wall-clock times: the fake clock starts now.
			f.clock.mu.Lock()
			f.clock.now = time.Now().UTC()
			f.clock.mu.Unlock()
			f.policy(stopPolicy())
			f.rec = f.reclaimerWith(reclaim.Config{Proxy: redisstore.NewNotebooks(f.rdb, f.prefix),
				Prober: reclaim.NewProber(nil, 0, func(_ context.Context, s fleet.Server) (string, string, error) { return s.URL, token, nil })})
			srv := fleet.Server{
				ServerKey: fleet.ServerKey{User: "ada", Name: "nb"}, Profile: "small", SpawnID: "spawn-1", State: v1.StateRunning,
				Slice: slice, URL: nb.URL, CreatedAt: f.clock.Now(),
				Allocation: &fleet.Allocation{SliceID: "spawn-1", User: "ada", Slice: slice, GPUUUID: "GPU-1", Node: "n1"},
			}
			if ok, err := f.store.RestoreServer(ctx, srv); err != nil || !ok {
				t.Fatalf("restore server: %v %v", ok, err)
			}
			f.run(30*time.Minute, "spawn-1", constSM(0))
			f.checkOutcome("nb", tc.want, tc.inWhy)
			if tc.want.Stops == 1 {
				acts := []string{}
				for _, e := range f.audit() {
					acts = append(acts, e.Action)
				}
				if diff := cmp.Diff([]string{reclaim.AuditStop, reclaim.AuditWarn}, acts); diff != "" {
					t.Errorf("audit actions, newest first (-want +got):\n%s", diff)
				}
			}
		})
	}
}

// waitKernelState waits until the notebook's API reports its one kernel in
// one of states (as the reclaimer's probe reads it), or fails t at ctx's end.
func waitKernelState(ctx context.Context, t *testing.T, c jupytertest.Client, states ...string) {
	t.Helper()
	for {
		ks, err := c.Kernels(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(ks) == 1 && slices.Contains(states, ks[0].ExecutionState) {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the notebook never reported its kernel %v: %+v", states, ks)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
