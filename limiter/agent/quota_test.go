package agent

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/redistest"
	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
	"github.com/gpubroker/gpubroker/limiter/region"
)

// TestApplyQuotasIsLevelBasedAndIdempotent drives the resync path (no
// pub/sub): the slice is prepared with its initial quota first, a desired
// quota is written once per change, with a higher file generation each
// time, and the applied generation follows the desired one.
func TestApplyQuotasIsLevelBasedAndIdempotent(t *testing.T) {
	e := newEnv(t)
	srv := redistest.Start(t)
	store := agentstore.New(srv.Client(t), srv.Prefix(t))
	a := e.agent(t, Config{}, store)
	ctx := t.Context()
	quotaFile := filepath.Join(e.root, v1.HostSlicesSubdir, "slice-a", "quota", v1.QuotaFileName)

	// No desired quota: the pod's initial slice is written as the first
	// quota file, with the slice's GPU, and the usage region is created.
	if err := a.applyQuotas(ctx); err != nil {
		t.Fatal(err)
	}
	gpu := e.pods[0].GPU
	initial := region.Quota{Generation: 1, SliceID: "slice-a", MemoryLimitBytes: 2048 * mib, ComputePercent: 20, ComputeLimitPercent: 50, GPUUUID: gpu}
	if q, err := region.ReadQuota(quotaFile); err != nil || q != initial {
		t.Fatalf("first quota file %+v, %v; want %+v", q, err, initial)
	}
	if _, err := store.AppliedQuota(ctx, "slice-a"); err == nil {
		t.Error("an applied generation was recorded without a desired quota")
	}
	usageFile := filepath.Join(e.root, v1.HostSlicesSubdir, "slice-a", "usage", v1.UsageFileName)
	if st, err := os.Stat(usageFile); err != nil || st.Mode().Perm() != region.UsageMode {
		t.Errorf("usage file %v, %v; want mode %v", st, err, region.UsageMode)
	}
	if st, err := os.Stat(filepath.Dir(usageFile)); err != nil || st.Mode().Perm() != 0o755 {
		t.Errorf("usage directory %v, %v; want mode 0755 (only root replaces the file)", st, err)
	}

	steps := []struct {
		name     string
		set      *v1.Slice // nil: no change before this pass
		wantFile region.Quota
		wantGen  int64
	}{
		{name: "first desired quota is written at the next generation", set: &v1.Slice{MemoryMiB: 1024, ComputePercent: 20, ComputeLimitPercent: 50},
			wantFile: region.Quota{Generation: 2, SliceID: "slice-a", MemoryLimitBytes: 1024 * mib, ComputePercent: 20, ComputeLimitPercent: 50, GPUUUID: gpu}, wantGen: 1},
		{name: "a pass without change rewrites nothing",
			wantFile: region.Quota{Generation: 2, SliceID: "slice-a", MemoryLimitBytes: 1024 * mib, ComputePercent: 20, ComputeLimitPercent: 50, GPUUUID: gpu}, wantGen: 1},
		{name: "a change is written at the next generation", set: &v1.Slice{MemoryMiB: 4096, ComputePercent: 30, ComputeLimitPercent: 30},
			wantFile: region.Quota{Generation: 3, SliceID: "slice-a", MemoryLimitBytes: 4096 * mib, ComputePercent: 30, ComputeLimitPercent: 30, GPUUUID: gpu}, wantGen: 2},
		{name: "the same values again bump only the applied generation", set: &v1.Slice{MemoryMiB: 4096, ComputePercent: 30, ComputeLimitPercent: 30},
			wantFile: region.Quota{Generation: 3, SliceID: "slice-a", MemoryLimitBytes: 4096 * mib, ComputePercent: 30, ComputeLimitPercent: 30, GPUUUID: gpu}, wantGen: 3},
	}
	for _, st := range steps {
		if st.set != nil {
			if _, err := store.SetDesiredQuota(ctx, "slice-a", *st.set); err != nil {
				t.Fatal(err)
			}
		}
		if err := a.applyQuotas(ctx); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		q, err := region.ReadQuota(quotaFile)
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if diff := cmp.Diff(st.wantFile, q); diff != "" {
			t.Errorf("%s: quota file (-want +got):\n%s", st.name, diff)
		}
		ap, err := store.AppliedQuota(ctx, "slice-a")
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if ap.Generation != st.wantGen || ap.FileGeneration != st.wantFile.Generation || ap.Node != "gpu-1" {
			t.Errorf("%s: applied %+v, want generation %d, file generation %d on gpu-1", st.name, ap, st.wantGen, st.wantFile.Generation)
		}
		if got := a.limitsOf(e.pods[0]).memoryBytes; got != st.wantFile.MemoryLimitBytes {
			t.Errorf("%s: limit in effect %d bytes, want %d", st.name, got, st.wantFile.MemoryLimitBytes)
		}
	}
}
