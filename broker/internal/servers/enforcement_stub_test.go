package servers_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/servers"
	"github.com/gpubroker/gpubroker/broker/internal/servers/serverstest"
	"github.com/gpubroker/gpubroker/limiter/agent"
	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
	"github.com/gpubroker/gpubroker/limiter/hook/stubtest"
)

// fakePodProc writes a proc(5) tree in which pid (a real process, with its
// real start time) runs in pod podUID: what the node agent sees of a
// notebook process on a real node (its cgroup names the pod).
func fakePodProc(t *testing.T, pid int, podUID string) string {
	t.Helper()
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	dir := filepath.Join(root, fmt.Sprint(pid))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{
		"stat":   string(stat),
		"status": fmt.Sprintf("Name:\tcudaprog\nPid:\t%d\nNSpid:\t%d\n", pid, pid),
		"cgroup": "0::/kubepods/burstable/pod" + podUID + "/" + strings.Repeat("c", 64) + "\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// TestUnhookedProcessPastTheSliceIsStoppedAndToldToTheServer runs the real
// node agent with its default policy over the stub driver, the broker's
// enforcement follower and the server's store on a real redis-server: a
// process of alice/lab's pod that runs without the hook and holds 12 GiB of
// its 10 GiB slice is stopped within the configured samples, audited, and
// the server's events and message say so in words.
func TestUnhookedProcessPastTheSliceIsStoppedAndToldToTheServer(t *testing.T) {
	stubtest.Need(t)
	f := serverstest.New(t)
	ctx := t.Context()
	key, rec := runningLab(t, f)

	dir := t.TempDir()
	state := filepath.Join(dir, "stub.state")
	t.Setenv("GPUBROKER_STUB_STATE", state) // the stub NVML the agent loads in this process
	rogue := stubtest.Start(t, append(stubtest.Environ(), "GPUBROKER_STUB_STATE="+state, "LD_LIBRARY_PATH="+stubtest.StubDir()))
	if res, _ := rogue.Do("alloc linear 12884901888"); res != 0 {
		t.Fatalf("12 GiB without the hook: CUresult %d", res)
	}

	store := agentstore.New(f.Redis.Client(t), f.Redis.Prefix(t))
	runCtx, cancel := context.WithCancel(context.Background())
	follow := make(chan error, 1)
	go func() { follow <- f.Service.FollowEnforcement(runCtx, store, "replica-1") }()
	rdb := f.Redis.Client(t)
	stubtest.Eventually(t, "the broker's consumer group on the audit stream", func() (bool, string) {
		g, err := rdb.XInfoGroups(ctx, store.Keys().AgentAudit()).Result()
		return err == nil && len(g) == 1 && g[0].Name == servers.EnforcementGroup, fmt.Sprint(g, err)
	})
	const samples = 3
	const podUID = "aaaaaaaa-0000-4000-8000-000000000001" // the uid as the pod's cgroup spells it
	a, err := agent.New(agent.Config{Node: "n1", HostRoot: filepath.Join(dir, "host"), SampleInterval: 100 * time.Millisecond,
		Enforcement: agent.Policy{Samples: samples}},
		agent.Deps{NVML: nvml.New(nvml.WithLibraryPath(filepath.Join(stubtest.StubDir(), "libnvidia-ml.so.1"))),
			Samples: store, Quotas: store, Audit: store, Log: f.Log, Proc: agent.ProcFS{Root: fakePodProc(t, rogue.Pid(), podUID)},
			Pods: agent.StaticPods{{ID: rec.SpawnID, PodUID: podUID, Pod: rec.Pod, Namespace: serverstest.Namespace,
				User: "alice", Server: "lab", GPU: stubtest.DeviceUUID, Initial: rec.Slice}}})
	if err != nil {
		t.Fatal(err)
	}
	run := make(chan error, 1)
	go func() { run <- a.Run(runCtx) }()
	defer func() {
		cancel()
		for _, ch := range []chan error{run, follow} {
			if err := <-ch; err != nil {
				t.Errorf("Run: %v", err)
			}
		}
	}()

	select {
	case <-rogue.Exited():
	case <-time.After(30 * time.Second):
		t.Fatal("the unhooked process was not stopped within 30 s")
	}
	// The record is written right after the kill.
	stubtest.Eventually(t, "the audit record", func() (bool, string) {
		recs, err := store.RecentAudit(ctx, 10)
		return err == nil && len(recs) == 1 && recs[0].Action == agentstore.ActionKill && recs[0].PID == uint32(rogue.Pid()) &&
			recs[0].Samples == samples && recs[0].User == "alice" && recs[0].Server == "lab", fmt.Sprintf("%+v %v", recs, err)
	})
	const want = "a process used 12 GiB of this server's 10 GiB slice and was stopped"
	stubtest.Eventually(t, "the server's event", func() (bool, string) {
		evs, err := f.Service.Events(ctx, key, "", 0)
		if err != nil || len(evs) == 0 {
			return false, fmt.Sprint(evs, err)
		}
		last := evs[len(evs)-1]
		return last.Message == want && last.State == v1.StateRunning && last.SpawnID == rec.SpawnID, fmt.Sprintf("%+v", last)
	})
	if srv, err := f.Service.Get(ctx, key); err != nil || srv.Message != want || srv.State != v1.StateRunning {
		t.Errorf("server %+v, %v; want it still running, its message %q", srv, err, want)
	}
}
