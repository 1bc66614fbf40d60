package httpapi

import (
	"net/http"
	"testing"

	"github.com/google/go-cmp/cmp"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
)

func TestPutGPUThenList(t *testing.T) {
	h := newHarness(t)
	for _, c := range []struct{ uuid, body string }{
		{"GPU-b", `{"node":"gpu-1","model":"NVIDIA H200","memoryMiB":143771,"smCount":132,"healthy":true}`},
		{"GPU-a", `{"uuid":"GPU-a","node":"gpu-1","model":"NVIDIA H200","memoryMiB":143771,"smCount":132,"healthy":true}`},
		{"GPU-c", `{"node":"gpu-0","model":"NVIDIA H200","memoryMiB":143771,"smCount":132}`},
	} {
		rec := h.do(t, req{method: "PUT", path: "/api/v1/admin/gpus/" + c.uuid, token: tokAdmin, body: c.body})
		if rec.Code != http.StatusOK || decode[v1.GPU](t, rec).UUID != c.uuid {
			t.Fatalf("put %s: %d %s", c.uuid, rec.Code, rec.Body)
		}
	}
	h.fleet.allocs = []fleet.Allocation{
		{SliceID: "s1", GPUUUID: "GPU-a", Slice: fleet.Slice{MemoryMiB: 8192, ComputePercent: 20, ComputeLimitPercent: 50}},
		{SliceID: "s2", GPUUUID: "GPU-a", Slice: fleet.Slice{MemoryMiB: 4096, ComputePercent: 10, ComputeLimitPercent: 10}},
		{SliceID: "s3", GPUUUID: "GPU-gone", Slice: fleet.Slice{MemoryMiB: 1, ComputePercent: 1, ComputeLimitPercent: 1}},
	}
	rec := h.do(t, req{method: "GET", path: "/api/v1/admin/gpus", token: tokAdmin})
	h200 := func(uuid, node string, healthy bool) v1.GPU {
		return v1.GPU{UUID: uuid, Node: node, Model: "NVIDIA H200", MemoryMiB: 143771, SMCount: 132, Healthy: healthy}
	}
	want := []v1.GPUStatus{
		{GPU: h200("GPU-c", "gpu-0", true)}, // healthy omitted: true
		{GPU: h200("GPU-a", "gpu-1", true), AllocatedMemoryMiB: 12288, AllocatedComputePercent: 30, Slices: 2},
		{GPU: h200("GPU-b", "gpu-1", true)},
	}
	if diff := cmp.Diff(want, decode[[]v1.GPUStatus](t, rec)); diff != "" {
		t.Errorf("gpus (-want +got):\n%s", diff)
	}
}

func TestPutGPURefusals(t *testing.T) {
	tests := []struct {
		name    string
		uuid    string
		body    string
		wantMsg string
	}{
		{name: "uuid differs", uuid: "GPU-a", body: `{"uuid":"GPU-b","node":"n","memoryMiB":1,"smCount":1}`,
			wantMsg: `body uuid "GPU-b" differs from the path's "GPU-a"`},
		{name: "every problem at once", uuid: "GPU-a", body: `{"node":"","memoryMiB":0,"smCount":0}`,
			wantMsg: "gpu node is empty; gpu memoryMiB must be > 0, got 0; gpu smCount must be > 0, got 0"},
		{name: "number out of range", uuid: "GPU-a", body: `{"node":"n","memoryMiB":1e30,"smCount":1}`,
			wantMsg: `field "memoryMiB" holds number 1e30, which is not a whole number in range (byte 28)`},
		{name: "unknown field", uuid: "GPU-a", body: `{"node":"n","memoryMiB":1,"smCount":1,"mig":true}`,
			wantMsg: `the body has an unknown field "mig"`},
		{name: "not a gpu uuid", uuid: "not%20a%20uuid", body: `{"node":"n","memoryMiB":1,"smCount":1}`,
			wantMsg: `gpu uuid "not a uuid" is not GPU- or MIG- followed by letters, digits, '.', '_' or '-' (at most 128)`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			rec := h.do(t, req{method: "PUT", path: "/api/v1/admin/gpus/" + tc.uuid, token: tokAdmin, body: tc.body})
			want := v1.Error{Code: v1.CodeBadRequest, Message: tc.wantMsg}
			if diff := cmp.Diff(want, decode[v1.Error](t, rec)); rec.Code != http.StatusBadRequest || diff != "" {
				t.Errorf("status %d, error (-want +got):\n%s", rec.Code, diff)
			}
			if len(h.fleet.gpus) != 0 {
				t.Errorf("a refused GPU was registered: %v", h.fleet.gpus)
			}
		})
	}
}

func TestGPUStoreFailureIs500(t *testing.T) {
	h := newHarness(t)
	h.fleet.err = errBoom
	for _, r := range []req{
		{method: "GET", path: "/api/v1/admin/gpus", token: tokAdmin},
		{method: "PUT", path: "/api/v1/admin/gpus/GPU-a", token: tokAdmin, body: `{"node":"n","memoryMiB":1,"smCount":1}`},
	} {
		rec := h.do(t, r)
		if got := decode[v1.Error](t, rec); rec.Code != 500 || got.Code != v1.CodeInternal {
			t.Errorf("%s %s: %d %+v", r.method, r.path, rec.Code, got)
		}
	}
}

func TestPutGPUCannotShrinkBelowItsSlices(t *testing.T) {
	h := newHarness(t)
	h.fleet.allocs = []fleet.Allocation{
		{SliceID: "s1", GPUUUID: "GPU-a", Slice: fleet.Slice{MemoryMiB: 8192, ComputePercent: 20, ComputeLimitPercent: 50}},
		{SliceID: "s2", GPUUUID: "GPU-a", Slice: fleet.Slice{MemoryMiB: 4096, ComputePercent: 10, ComputeLimitPercent: 10}},
	}
	rec := h.do(t, req{method: "PUT", path: "/api/v1/admin/gpus/GPU-a", token: tokAdmin, body: `{"node":"n","memoryMiB":1000,"smCount":132}`})
	want := v1.Error{Code: v1.CodeConflict, Message: "GPU GPU-a holds 2 slices with 12288 MiB; its memory cannot be set to 1000 MiB"}
	if diff := cmp.Diff(want, decode[v1.Error](t, rec)); rec.Code != http.StatusConflict || diff != "" {
		t.Errorf("status %d, error (-want +got):\n%s", rec.Code, diff)
	}
	if len(h.fleet.gpus) != 0 {
		t.Errorf("the refused GPU was registered: %v", h.fleet.gpus)
	}
}
