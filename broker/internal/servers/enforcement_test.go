package servers_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/broker/internal/servers"
	"github.com/gpubroker/gpubroker/broker/internal/servers/serverstest"
	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
)

// runningLab creates alice's server lab of profile small and brings its pod
// to running.
func runningLab(t *testing.T, f *serverstest.Fixture) (fleet.ServerKey, fleet.Server) {
	t.Helper()
	key := fleet.ServerKey{User: "alice", Name: "lab"}
	rec, _, err := f.Service.Create(t.Context(), serverstest.By, "alice", nil, "lab", v1.CreateServerRequest{Profile: "small"}, "k1")
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	f.SetPodRunning(t, "alice", "lab", "10.0.0.7")
	f.WaitState(t, key, v1.StateRunning)
	return key, rec
}

func TestEnforcementMessageSaysWhatHappenedInWords(t *testing.T) {
	tests := []struct {
		name string
		r    agentstore.AuditRecord
		want string
	}{
		{name: "one process stopped",
			r:    agentstore.AuditRecord{Action: agentstore.ActionKill, Reason: agentstore.ReasonOverMemory, MemoryUsedMiB: 12390, ProcessMemoryMiB: 12390, MemoryLimitMiB: 8192},
			want: "a process used 12.1 GiB of this server's 8 GiB slice and was stopped"},
		{name: "the largest of several stopped",
			r:    agentstore.AuditRecord{Action: agentstore.ActionKill, Reason: agentstore.ReasonOverMemory, MemoryUsedMiB: 9216, ProcessMemoryMiB: 6144, MemoryLimitMiB: 8192},
			want: "this server's processes used 9 GiB of its 8 GiB slice; the largest, using 6 GiB, was stopped"},
		{name: "reported only",
			r:    agentstore.AuditRecord{Action: agentstore.ActionReport, Reason: agentstore.ReasonOverMemory, MemoryUsedMiB: 900, MemoryLimitMiB: 512},
			want: "a process used 900 MiB of this server's 512 MiB slice and was reported, not stopped (this node only reports)"},
		{name: "hidden from the limiter",
			r:    agentstore.AuditRecord{Action: agentstore.ActionKill, Reason: agentstore.ReasonHidden, MemoryUsedMiB: 1229, MemoryLimitMiB: 8192},
			want: "a process used 1.2 GiB of GPU memory without going through this server's GPU limiter and was stopped"},
		{name: "stopping failed",
			r:    agentstore.AuditRecord{Action: agentstore.ActionKillFailed, Reason: agentstore.ReasonHidden, MemoryUsedMiB: 100, Error: "process already gone"},
			want: "a process used 100 MiB of GPU memory without going through this server's GPU limiter and could not be stopped (process already gone)"},
		{name: "over its compute limit",
			r:    agentstore.AuditRecord{Action: agentstore.ActionKill, Reason: agentstore.ReasonOverCompute, SMPercent: 75, ComputeLimitPercent: 30},
			want: "this server's processes used 75% of the GPU's compute, more than its slice's 30% limit; the busiest was stopped"},
		{name: "over its compute limit, reported",
			r:    agentstore.AuditRecord{Action: agentstore.ActionReport, Reason: agentstore.ReasonOverCompute, SMPercent: 55, ComputeLimitPercent: 40},
			want: "this server's processes used 55% of the GPU's compute, more than its slice's 40% limit; the busiest was reported, not stopped"},
		{name: "usage region tampered with",
			r:    agentstore.AuditRecord{Action: agentstore.ActionReport, Reason: agentstore.ReasonUsageTampered, Error: "usage region replaced: it is not the file the agent created"},
			want: "this server's GPU usage file was replaced or damaged (usage region replaced: it is not the file the agent created): its programs can no longer allocate GPU memory; restart the server"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := servers.EnforcementMessage(tc.r); got != tc.want {
				t.Errorf("EnforcementMessage = %q\nwant               %q", got, tc.want)
			}
		})
	}
}

// TestHandleEnforcementTellsTheRunningServer: a record of the server's
// current spawn becomes an event and the server's message; records of an
// older spawn, of no server, or of a server that is not running change
// nothing.
func TestHandleEnforcementTellsTheRunningServer(t *testing.T) {
	f := serverstest.New(t)
	ctx := t.Context()
	key, rec := runningLab(t, f)
	before, err := f.Service.Events(ctx, key, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	kill := agentstore.AuditRecord{Action: agentstore.ActionKill, Reason: agentstore.ReasonOverMemory, User: "alice", Server: "lab",
		Slice: rec.SpawnID, MemoryUsedMiB: 12390, ProcessMemoryMiB: 12390, MemoryLimitMiB: 10240}
	ignored := []agentstore.AuditRecord{
		{Action: agentstore.ActionKill, Reason: agentstore.ReasonNoSlice, MemoryUsedMiB: 64},
		func() agentstore.AuditRecord { r := kill; r.Slice = "spawn-old"; return r }(),
		func() agentstore.AuditRecord { r := kill; r.Server = "other"; return r }(),
	}
	for _, r := range append(ignored, kill) {
		if err := f.Service.HandleEnforcement(ctx, r); err != nil {
			t.Fatalf("HandleEnforcement(%+v): %v", r, err)
		}
	}
	evs, err := f.Service.Events(ctx, key, before[len(before)-1].ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	const want = "a process used 12.1 GiB of this server's 10 GiB slice and was stopped"
	var got []string
	for _, e := range evs {
		got = append(got, string(e.State)+": "+e.Message)
	}
	if diff := cmp.Diff([]string{"running: " + want}, got); diff != "" {
		t.Errorf("new events (-want +got):\n%s", diff)
	}
	srv, err := f.Service.Get(ctx, key)
	if err != nil || srv.Message != want || srv.State != v1.StateRunning {
		t.Errorf("server %+v, %v; want it running with the message %q", srv, err, want)
	}
}
