package httpapi

import (
	"maps"
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

func TestPutGPUMode(t *testing.T) {
	h := newHarness(t)
	h.fleet.gpus["GPU-a"] = fleet.GPU{UUID: "GPU-a", Node: "gpu-1", Model: "NVIDIA H200", MemoryMiB: 143771, SMCount: 132, Healthy: true, Mode: fleet.SharingSliced}
	h.fleet.gpus["GPU-b"] = fleet.GPU{UUID: "GPU-b", Node: "gpu-1", Model: "NVIDIA H200", MemoryMiB: 143771, SMCount: 132, Healthy: true, Mode: fleet.SharingSliced}
	h.fleet.allocs = []fleet.Allocation{{SliceID: "s1", GPUUUID: "GPU-b", Slice: fleet.Slice{MemoryMiB: 8192, ComputePercent: 20, ComputeLimitPercent: 50}}}

	rec := h.do(t, req{method: "PUT", path: "/api/v1/admin/gpus/GPU-a/mode", token: tokAdmin, body: `{"mode":"exclusive"}`})
	if got := decode[v1.GPU](t, rec); rec.Code != http.StatusOK || got.UUID != "GPU-a" || got.Mode != v1.SharingExclusive {
		t.Fatalf("set exclusive: %d %+v", rec.Code, got)
	}
	rec = h.do(t, req{method: "GET", path: "/api/v1/admin/gpus", token: tokAdmin})
	if got := decode[[]v1.GPUStatus](t, rec); len(got) != 2 || got[0].Mode != v1.SharingExclusive || got[1].Mode != v1.SharingSliced {
		t.Errorf("list after the change: %+v", got)
	}
	rec = h.do(t, req{method: "PUT", path: "/api/v1/admin/gpus/GPU-a/mode", token: tokAdmin, body: `{"mode":""}`})
	if got := decode[v1.GPU](t, rec); rec.Code != http.StatusOK || got.Mode != v1.SharingSliced {
		t.Errorf("follow the label again: %d %+v", rec.Code, got)
	}

	tests := []struct {
		name, uuid, token, body string
		status                  int
		code, msg               string
	}{
		{name: "mode is required", uuid: "GPU-a", token: tokAdmin, body: `{}`, status: 400, code: v1.CodeBadRequest,
			msg: `mode is required: sliced, exclusive, mps, or "" to follow the node's label`},
		{name: "unknown mode", uuid: "GPU-a", token: tokAdmin, body: `{"mode":"shared"}`, status: 400, code: v1.CodeBadRequest,
			msg: `sharing mode must be sliced, exclusive or mps, got "shared"`},
		{name: "unknown field", uuid: "GPU-a", token: tokAdmin, body: `{"mode":"mps","force":true}`, status: 400, code: v1.CodeBadRequest,
			msg: `the body has an unknown field "force"`},
		{name: "a GPU holding servers keeps its mode", uuid: "GPU-b", token: tokAdmin, body: `{"mode":"mps"}`, status: 409, code: v1.CodeConflict,
			msg: "gpu GPU-b holds servers"},
		{name: "unknown GPU", uuid: "GPU-z", token: tokAdmin, body: `{"mode":"mps"}`, status: 404, code: v1.CodeNotFound,
			msg: "gpu GPU-z is not registered"},
		{name: "users may not", uuid: "GPU-a", token: tokAlice, body: `{"mode":"mps"}`, status: 403, code: v1.CodeForbidden},
		{name: "not a gpu uuid is simply unknown", uuid: "nope", token: tokAdmin, body: `{"mode":"mps"}`, status: 404, code: v1.CodeNotFound},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := maps.Clone(h.fleet.gpus)
			rec := h.do(t, req{method: "PUT", path: "/api/v1/admin/gpus/" + tc.uuid + "/mode", token: tc.token, body: tc.body})
			got := decode[v1.Error](t, rec)
			if rec.Code != tc.status || got.Code != tc.code || (tc.msg != "" && got.Message != tc.msg) {
				t.Errorf("got %d %+v, want %d %s %q", rec.Code, got, tc.status, tc.code, tc.msg)
			}
			if diff := cmp.Diff(before, h.fleet.gpus); diff != "" {
				t.Errorf("a refused change changed the fleet (-before +after):\n%s", diff)
			}
		})
	}
}

func TestGuaranteesShown(t *testing.T) {
	met := v1.Guarantee{Percent: 30, WindowSeconds: 3600, WantedSeconds: 1200, MetSeconds: 1188}
	worst := v1.Guarantee{Percent: 70, WindowSeconds: 3600, WantedSeconds: 1000, MetSeconds: 400, Slice: "spawn-9", Tenants: 2}
	g := fakeGuarantees{gpus: map[string]v1.Guarantee{"GPU-1": worst}, servers: map[string]v1.Guarantee{"spawn-1": met}}
	h := newHarness(t, harnessConfig{guar: g})
	h.fleet.gpus["GPU-1"] = fleet.GPU{UUID: "GPU-1", Node: "gpu-1", MemoryMiB: 143771, SMCount: 132, Healthy: true, Mode: fleet.SharingSliced}
	h.fleet.gpus["GPU-2"] = fleet.GPU{UUID: "GPU-2", Node: "gpu-1", MemoryMiB: 143771, SMCount: 132, Healthy: true, Mode: fleet.SharingSliced}

	rec := h.do(t, req{method: "GET", path: "/api/v1/admin/gpus", token: tokAdmin})
	gpus := decode[[]v1.GPUStatus](t, rec)
	if len(gpus) != 2 || gpus[0].Guarantee == nil || *gpus[0].Guarantee != worst || gpus[1].Guarantee != nil {
		t.Errorf("gpus: %+v", gpus)
	}

	seedAlice(t, h)
	k := fleet.ServerKey{User: "alice", Name: "nb"}
	get := func() v1.Server {
		t.Helper()
		return decode[v1.Server](t, h.do(t, req{method: "GET", path: "/api/v1/users/alice/servers/nb", token: tokAlice}))
	}
	if s := get(); s.Guarantee != nil {
		t.Errorf("a pending server has figures: %+v", s.Guarantee)
	}
	h.servers.advance(k, v1.StatePlacing, "placing")
	h.servers.advance(k, v1.StateRunning, "running")
	if s := get(); s.Guarantee == nil || *s.Guarantee != met {
		t.Errorf("running server's guarantee = %+v, want %+v", s.Guarantee, met)
	}

	// Figures that cannot be read leave them out and are logged; the
	// answers stand.
	h2 := newHarness(t, harnessConfig{guar: fakeGuarantees{err: errBoom}})
	h2.fleet.gpus["GPU-1"] = h.fleet.gpus["GPU-1"]
	rec = h2.do(t, req{method: "GET", path: "/api/v1/admin/gpus", token: tokAdmin})
	if got := decode[[]v1.GPUStatus](t, rec); rec.Code != 200 || len(got) != 1 || got[0].Guarantee != nil {
		t.Errorf("gpus with the figures down: %d %+v", rec.Code, got)
	}
	warned := false
	for _, l := range h2.logs.lines(t) {
		warned = warned || (l["msg"] == "guarantee figures not read" && l["level"] == "WARN")
	}
	if !warned {
		t.Errorf("no warning logged: %v", h2.logs.lines(t))
	}
}
