package agent

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/google/go-cmp/cmp"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/redistest"
	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
	"github.com/gpubroker/gpubroker/limiter/region"
)

// usageWith writes slice id's usage region with a slot per (nspid, start).
func usageWith(t *testing.T, e *testEnv, id string, procs ...nsKey) string {
	t.Helper()
	path := filepath.Join(e.root, v1.HostSlicesSubdir, id, "usage", v1.UsageFileName)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	initUsage(t, path)
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for i, p := range procs {
		var slot [16]byte
		slot[0], slot[1], slot[2], slot[3] = byte(p.pid), byte(p.pid>>8), byte(p.pid>>16), byte(p.pid>>24)
		for b := range 8 {
			slot[8+b] = byte(p.start >> (8 * b))
		}
		if _, err := f.WriteAt(slot[:], int64(256+128*i)); err != nil {
			t.Fatal(err)
		}
	}
	return path
}

// TestProcessHiddenFromTheHookIsStopped: a GPU process of slice A's pod that
// has no slot in A's usage region (the hook never saw it) is stopped after
// Samples rounds, by default; the ones with slots are left alone, and a
// slice whose region was not read is not judged.
func TestProcessHiddenFromTheHookIsStopped(t *testing.T) {
	e := newEnv(t)
	usageWith(t, e, "slice-a", nsKey{pid: 12, start: 1000}) // 100 (nspid 12) is in; 101 (nspid 13) is not
	usageWith(t, e, "slice-b", nsKey{pid: 7, start: 2000})
	a := e.agent(t, Config{Enforcement: Policy{OrphanGrace: time.Hour}}, nil)
	for range 3 {
		e.clock.Advance(time.Second)
		if err := a.enforce(t.Context(), a.sampleRound(t.Context())); err != nil {
			t.Fatal(err)
		}
	}
	if diff := cmp.Diff([]uint32{101}, e.killer.killed); diff != "" {
		t.Errorf("killed (-want +got):\n%s", diff)
	}
	recs := e.audit.all()
	if len(recs) != 1 {
		t.Fatalf("audit %+v, want one record", recs)
	}
	if r := recs[0]; r.Action != agentstore.ActionKill || r.Reason != agentstore.ReasonHidden || r.PID != 101 || r.Slice != "slice-a" ||
		r.ProcessMemoryMiB != 512 || r.MemoryLimitMiB != 2048 || r.Samples != 3 {
		t.Errorf("record %+v, want kill hidden of 101 in slice-a with 512 of 2048 MiB after 3 samples", r)
	}
}

// sliceARounds starts an agent on e and returns a sampling and enforcing
// round that gives slice-a's sample, after checking that a first round
// finds nothing missing.
func sliceARounds(t *testing.T, e *testEnv) func() agentstore.Sample {
	t.Helper()
	a := e.agent(t, Config{Enforcement: Policy{OrphanGrace: time.Hour}}, nil)
	round := func() agentstore.Sample {
		t.Helper()
		e.clock.Advance(time.Second)
		r := a.sampleRound(t.Context())
		if err := a.enforce(t.Context(), r); err != nil {
			t.Fatal(err)
		}
		return samples(r)["slice-a"]
	}
	if s := round(); s.Missing != "" {
		t.Fatalf("first round missing %q", s.Missing)
	}
	return round
}

// TestUsageRegionTamperingIsReportedOnce: a usage region replaced by another
// file (root in the container can), or turned into a FIFO, is not read; the
// sample says why, and one report-only audit record per change says so.
func TestUsageRegionTamperingIsReportedOnce(t *testing.T) {
	e := newEnv(t)
	path := usageWith(t, e, "slice-a", nsKey{pid: 12, start: 1000}, nsKey{pid: 13, start: 1001})
	round := sliceARounds(t, e)
	// A copy of the region renamed over it: the same bytes, another file.
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path+".new", b, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if s := round(); !strings.Contains(s.Missing, "usage region replaced") {
			t.Errorf("after the replacement the sample's missing is %q", s.Missing)
		}
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(path, 0o666); err != nil {
		t.Fatal(err)
	}
	done := make(chan agentstore.Sample, 1)
	go func() { done <- round() }()
	select {
	case s := <-done:
		if !strings.Contains(s.Missing, "usage region unusable: not a regular file") {
			t.Errorf("with a FIFO the sample's missing is %q", s.Missing)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a sampling round blocked on a FIFO at the usage path")
	}
	var got []string
	for _, r := range e.audit.all() {
		got = append(got, r.Action+" "+r.Reason+" "+r.Slice+": "+r.Error)
	}
	want := []string{
		"report usage-tampered slice-a: usage region replaced: it is not the file the agent created",
		"report usage-tampered slice-a: usage region unusable: not a regular file",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("audit (-want +got):\n%s", diff)
	}
	if len(e.killer.killed) != 0 {
		t.Errorf("killed %v: an unreadable region proves nothing about a process", e.killer.killed)
	}
}

// TestARemovedUsageRegionIsReportedAndNotForgotten: root in the container
// deletes the usage region; the agent says so, and a file planted in its
// place afterwards is not taken for the agent's own.
func TestARemovedUsageRegionIsReportedAndNotForgotten(t *testing.T) {
	e := newEnv(t)
	path := usageWith(t, e, "slice-a", nsKey{pid: 12, start: 1000})
	round := sliceARounds(t, e)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if s := round(); !strings.Contains(s.Missing, "usage region removed") {
		t.Errorf("after the removal the sample's missing is %q", s.Missing)
	}
	if err := os.WriteFile(path, b, 0o666); err != nil { // planted: the same bytes, another file
		t.Fatal(err)
	}
	if s := round(); !strings.Contains(s.Missing, "usage region replaced") {
		t.Errorf("with a planted file the sample's missing is %q", s.Missing)
	}
	var got []string
	for _, r := range e.audit.all() {
		got = append(got, r.Reason+": "+r.Error)
	}
	want := []string{
		"usage-tampered: usage region removed: the file the agent created is gone",
		"usage-tampered: usage region replaced: it is not the file the agent created",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("audit (-want +got):\n%s", diff)
	}
}

// TestPrepareSliceNeverBlocksOrFollows: whatever stands at a slice's usage
// or quota path (a FIFO, a socket, a directory, a symbolic link, a file of
// the wrong size), preparing the slice returns within a deadline, never
// writes through a link, replaces a bad quota path by rename with the
// initial quota, and refuses a bad usage path with the reason.
func TestPrepareSliceNeverBlocksOrFollows(t *testing.T) {
	for _, which := range []string{"quota", "usage"} {
		for _, kind := range []string{"fifo", "socket", "directory", "symlink", "truncated", "oversized"} {
			t.Run(which+"/"+kind, func(t *testing.T) {
				e := newEnv(t)
				a := e.agent(t, Config{}, nil)
				s := e.pods[0]
				dir := filepath.Join(e.root, v1.HostSlicesSubdir, s.ID)
				for _, sub := range []string{"quota", "usage"} {
					if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
						t.Fatal(err)
					}
				}
				path := a.slicePath(s.ID, "usage", v1.UsageFileName)
				size := region.UsageSize
				if which == "quota" {
					path, size = a.slicePath(s.ID, "quota", v1.QuotaFileName), region.QuotaSize
				}
				victim := filepath.Join(t.TempDir(), "victim")
				if err := os.WriteFile(victim, make([]byte, size), 0o600); err != nil {
					t.Fatal(err)
				}
				switch kind {
				case "fifo":
					err := syscall.Mkfifo(path, 0o600)
					if err != nil {
						t.Fatal(err)
					}
				case "socket":
					sock, err := os.MkdirTemp("", "gpa")
					if err != nil {
						t.Fatal(err)
					}
					defer os.RemoveAll(sock)
					ln, err := net.Listen("unix", filepath.Join(sock, "s"))
					if err != nil {
						t.Fatal(err)
					}
					ln.(*net.UnixListener).SetUnlinkOnClose(false)
					defer ln.Close()
					if err := os.Rename(filepath.Join(sock, "s"), path); err != nil {
						t.Fatal(err)
					}
				case "directory":
					if err := os.Mkdir(path, 0o755); err != nil {
						t.Fatal(err)
					}
				case "symlink":
					if err := os.Symlink(victim, path); err != nil {
						t.Fatal(err)
					}
				case "truncated", "oversized":
					n := size - 1
					if kind == "oversized" {
						n = size + 4096
					}
					if err := os.WriteFile(path, make([]byte, n), 0o600); err != nil {
						t.Fatal(err)
					}
				}
				done := make(chan error, 1)
				go func() { done <- a.prepareSlice(s) }()
				var err error
				select {
				case err = <-done:
				case <-time.After(10 * time.Second):
					t.Fatalf("prepareSlice with a %s at the %s path did not return within 10 s", kind, which)
				}
				switch {
				case which == "usage" && err == nil:
					t.Errorf("prepareSlice accepted a %s as the usage region", kind)
				case which == "usage":
					t.Logf("refused: %v", err)
				case which == "quota" && kind == "directory":
					if err == nil {
						t.Error("prepareSlice replaced a directory at the quota path")
					}
				case err != nil:
					t.Errorf("prepareSlice with a %s at the quota path: %v", kind, err)
				default:
					if q, err := region.ReadQuota(path); err != nil || q.MemoryLimitBytes != 2048*mib {
						t.Errorf("quota after prepareSlice: %+v, %v; want the initial 2048 MiB", q, err)
					}
				}
				if b, err := os.ReadFile(victim); err != nil || strings.Trim(string(b), "\x00") != "" {
					t.Errorf("the link's target was written (%v)", err)
				}
			})
		}
	}
}

// TestHostProcessIsReportedNeverStopped: a GPU process of the host itself
// (in no pod) is not a tenant's: even in kill mode it is only reported.
func TestHostProcessIsReportedNeverStopped(t *testing.T) {
	e := newEnv(t)
	e.setProcs(0, []nvml.ProcessInfo{{Pid: 300, UsedGpuMemory: 100 << 20}}, nil)
	e.setProcs(1, nil, nil)
	a := e.agent(t, Config{Enforcement: Policy{Mode: ModeKill, Samples: 1, OrphanGrace: -1}}, nil)
	if err := a.enforce(t.Context(), a.sampleRound(t.Context())); err != nil {
		t.Fatal(err)
	}
	recs := e.audit.all()
	if len(e.killer.killed) != 0 || len(recs) != 1 || recs[0].Action != agentstore.ActionReport || recs[0].Reason != agentstore.ReasonNoSlice {
		t.Errorf("killed %v, audit %s; want one report of no-slice and no kill", e.killer.killed, fmt.Sprint(recs))
	}
}

// TestBadUsagePathDoesNotStopQuotaChanges: whatever root in a container
// plants at its usage path, the agent still applies the slice's desired
// quota (a shrink the tenant could otherwise hold off), and reports the path.
func TestBadUsagePathDoesNotStopQuotaChanges(t *testing.T) {
	e := newEnv(t)
	srv := redistest.Start(t)
	store := agentstore.New(srv.Client(t), srv.Prefix(t))
	a := e.agent(t, Config{}, store)
	s := e.pods[0]
	if err := a.applyQuota(t.Context(), s); err != nil {
		t.Fatal(err)
	}
	usage := a.slicePath(s.ID, "usage", v1.UsageFileName)
	if err := os.Remove(usage); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(usage, 0o666); err != nil {
		t.Fatal(err)
	}
	if _, err := store.SetDesiredQuota(t.Context(), s.ID, v1.Slice{MemoryMiB: 512, ComputePercent: 10, ComputeLimitPercent: 10}); err != nil {
		t.Fatal(err)
	}
	err := a.applyQuota(t.Context(), s)
	if err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("applyQuota with a FIFO at the usage path: %v, want the path reported", err)
	}
	if q, err := region.ReadQuota(a.slicePath(s.ID, "quota", v1.QuotaFileName)); err != nil || q.MemoryLimitBytes != 512*mib {
		t.Errorf("quota after the shrink: %+v, %v; want 512 MiB applied", q, err)
	}
}
