package httpapi

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/api/v1/v1test"
	"github.com/gpubroker/gpubroker/broker/internal/reclaim"
	"github.com/gpubroker/gpubroker/broker/internal/redisstore"
	"github.com/gpubroker/gpubroker/broker/redistest"
)

func newPolicyHarness(t *testing.T) *harness {
	t.Helper()
	rs := redistest.Start(t)
	rdb, prefix := rs.Client(t), rs.Prefix(t)
	policies := reclaim.NewPolicies(redisstore.NewReclaim(rdb, prefix), func() time.Time { return testNow })
	return newHarness(t, harnessConfig{policy: policies, audit: redisstore.NewAuditLog(rdb, prefix, nil)})
}

const validPolicy = `{"version":%d,"enabled":true,"idleComputePercent":5,"idleAfterSeconds":3600,"action":"stop","warnSeconds":600,"reason":"save money"}`

func TestReclaimPolicyRoutes(t *testing.T) {
	h := newPolicyHarness(t)
	steps := []struct {
		name       string
		r          req
		wantStatus int
		wantIn     string // substring of the body
	}{
		{"default policy", req{method: "GET", path: "/api/v1/admin/reclaim-policy", token: tokAdmin}, 200, `"version":0`},
		{"users may not read it", req{method: "GET", path: "/api/v1/admin/reclaim-policy", token: tokAlice}, 403, "administrators"},
		{"users may not write it", req{method: "PUT", path: "/api/v1/admin/reclaim-policy", token: tokAlice, body: strings.Replace(validPolicy, "%d", "0", 1)}, 403, "administrators"},
		{"invalid policy lists every field", req{method: "PUT", path: "/api/v1/admin/reclaim-policy", token: tokAdmin,
			body: `{"version":0,"enabled":true,"idleComputePercent":150,"idleAfterSeconds":10,"action":"explode","warnSeconds":0}`}, 400,
			`"fields":[{"field":"idleComputePercent","message":"must be between 0 and 100 (percent of the GPU's SMs)"},{"field":"idleAfterSeconds"`},
		{"nothing saved", req{method: "GET", path: "/api/v1/admin/reclaim-policy", token: tokAdmin}, 200, `"version":0`},
		{"validate only: problems listed", req{method: "PUT", path: "/api/v1/admin/reclaim-policy?validate=true", token: tokAdmin,
			body: `{"version":0,"enabled":true,"idleComputePercent":5,"idleAfterSeconds":10,"action":"stop","warnSeconds":0}`}, 400,
			`"fields":[{"field":"idleAfterSeconds","message":"must be between 1 minute and 7 days"}]`},
		{"validate only: a valid policy answered normalized", req{method: "PUT", path: "/api/v1/admin/reclaim-policy?validate=true", token: tokAdmin,
			body: `{"version":0,"enabled":true,"idleComputePercent":5,"idleAfterSeconds":3600,"action":"stop","warnSeconds":600,"exemptGroups":[" b","a","b"]}`}, 200,
			`"exemptGroups":["a","b"]`},
		{"validate must be true", req{method: "PUT", path: "/api/v1/admin/reclaim-policy?validate=yes", token: tokAdmin, body: strings.Replace(validPolicy, "%d", "0", 1)}, 400, "validate must be true or absent"},
		{"still nothing saved", req{method: "GET", path: "/api/v1/admin/reclaim-policy", token: tokAdmin}, 200, `"version":0`},
		{"unknown field", req{method: "PUT", path: "/api/v1/admin/reclaim-policy", token: tokAdmin, body: `{"version":0,"colour":"red"}`}, 400, `unknown field \"colour\"`},
		{"valid policy saved", req{method: "PUT", path: "/api/v1/admin/reclaim-policy", token: tokAdmin, body: strings.Replace(validPolicy, "%d", "0", 1)}, 200, `"version":1`},
		{"stale version explained", req{method: "PUT", path: "/api/v1/admin/reclaim-policy", token: tokAdmin, body: strings.Replace(validPolicy, "%d", "0", 1)}, 409, "version 1 by root at 2026-11-29 15:00 UTC"},
		{"audit lists the change", req{method: "GET", path: "/api/v1/admin/audit?actor=root&limit=10", token: tokAdmin}, 200, `"action":"reclaim-policy.update"`},
		{"audit bad limit", req{method: "GET", path: "/api/v1/admin/audit?limit=0", token: tokAdmin}, 400, "limit must be"},
		{"audit bad cursor", req{method: "GET", path: "/api/v1/admin/audit?before=x", token: tokAdmin}, 400, "before must be"},
		{"audit bad source", req{method: "GET", path: "/api/v1/admin/audit?source=hub", token: tokAdmin}, 400, "source must be one of servers, reclaim, agent"},
		{"audit of the agents only", req{method: "GET", path: "/api/v1/admin/audit?source=agent", token: tokAdmin}, 200, `{"entries":[]}`},
		{"audit for users", req{method: "GET", path: "/api/v1/admin/audit", token: tokBob}, 403, "administrators"},
	}
	for _, s := range steps {
		rec := h.do(t, s.r)
		if rec.Code != s.wantStatus || !strings.Contains(rec.Body.String(), s.wantIn) {
			t.Errorf("%s: %d %s, want %d containing %s", s.name, rec.Code, rec.Body, s.wantStatus, s.wantIn)
		}
	}
	page := decode[v1.AuditPage](t, h.do(t, req{method: "GET", path: "/api/v1/admin/audit", token: tokAdmin}))
	if len(page.Entries) != 1 {
		t.Fatalf("audit entries %+v, want 1", page.Entries)
	}
	e := page.Entries[0]
	e.ID = ""
	want := v1.AuditEntry{Time: testNow, Source: v1.AuditSourceReclaim, Actor: "root", ActorKind: v1.ActorAdmin, Action: "reclaim-policy.update", Target: "reclaim-policy", Reason: "save money", PolicyVersion: 1,
		Inputs: map[string]string{"enabled": "false → true", "action": "warn → stop", "warnSeconds": "900 → 600"}}
	if diff := cmp.Diff(want, e); diff != "" {
		t.Errorf("audit entry (-want +got):\n%s", diff)
	}
	got := decode[v1.ReclaimPolicy](t, h.do(t, req{method: "GET", path: "/api/v1/admin/reclaim-policy", token: tokAdmin}))
	if got.Version != 1 || got.UpdatedBy != "root" || got.UpdatedAt == nil || !got.UpdatedAt.Equal(testNow) {
		t.Errorf("policy after save: %+v", got)
	}
	if rec := h.do(t, req{method: "GET", path: "/api/v1/admin/reclaim-policy", token: tokAdmin}); rec.Code != http.StatusOK {
		t.Errorf("get: %d", rec.Code)
	}
}

// TestReclaimPolicyCarriesEveryField saves, through PUT, a policy that
// sets every field of the wire type (v1test.FullReclaimPolicy, checked by
// reflection) and reads the same back through GET; only the fields the
// server owns (version, updatedBy, updatedAt) differ.
func TestReclaimPolicyCarriesEveryField(t *testing.T) {
	full := v1test.FullReclaimPolicy()
	if z := v1test.ZeroFields(full); len(z) != 0 {
		t.Fatalf("the fixture leaves %v zero", z)
	}
	h := newPolicyHarness(t)
	in := full
	in.Version = 0
	body, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	put := h.do(t, req{method: "PUT", path: "/api/v1/admin/reclaim-policy", token: tokAdmin, body: string(body)})
	if put.Code != http.StatusOK {
		t.Fatalf("put: %d %s", put.Code, put.Body)
	}
	got := decode[v1.ReclaimPolicy](t, h.do(t, req{method: "GET", path: "/api/v1/admin/reclaim-policy", token: tokAdmin}))
	want := full
	want.Version, want.UpdatedBy, want.UpdatedAt = 1, "root", &testNow
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("policy read back (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want, decode[v1.ReclaimPolicy](t, put)); diff != "" {
		t.Errorf("PUT's answer (-want +got):\n%s", diff)
	}
}
