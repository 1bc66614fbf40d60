package httpapi

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

func TestHealthz(t *testing.T) {
	h := newHarness(t)
	rec := h.do(t, req{method: http.MethodGet, path: "/healthz"})
	if diff := cmp.Diff(v1.Health{Status: "ok"}, decode[v1.Health](t, rec)); rec.Code != http.StatusOK || diff != "" {
		t.Errorf("status %d, body (-want +got):\n%s", rec.Code, diff)
	}
}

func TestReadyz(t *testing.T) {
	tests := []struct {
		name       string
		checkers   []Checker
		wantStatus int
		want       v1.Readiness
	}{
		{
			name:       "no checkers is ready",
			wantStatus: http.StatusOK,
			want:       v1.Readiness{Status: "ready", Checks: []v1.Check{}},
		},
		{
			name:       "all checks pass",
			checkers:   []Checker{fakeChecker{name: "redis"}, fakeChecker{name: "kubernetes"}},
			wantStatus: http.StatusOK,
			want:       v1.Readiness{Status: "ready", Checks: []v1.Check{{Name: "redis", OK: true}, {Name: "kubernetes", OK: true}}},
		},
		{
			name:       "a failing check makes 503 with its error",
			checkers:   []Checker{fakeChecker{name: "redis", err: errBoom}, fakeChecker{name: "kubernetes"}},
			wantStatus: http.StatusServiceUnavailable,
			want: v1.Readiness{Status: "not ready", Checks: []v1.Check{
				{Name: "redis", Error: errBoom.Error()}, {Name: "kubernetes", OK: true},
			}},
		},
		{
			name:       "a hanging check times out",
			checkers:   []Checker{fakeChecker{name: "kubernetes", block: true}},
			wantStatus: http.StatusServiceUnavailable,
			want: v1.Readiness{Status: "not ready", Checks: []v1.Check{
				{Name: "kubernetes", Error: "kubernetes: context deadline exceeded"},
			}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, harnessConfig{checkers: tc.checkers, opts: []Option{WithReadyTimeout(50 * 1e6)}})
			rec := h.do(t, req{method: http.MethodGet, path: "/readyz"})
			if rec.Code != tc.wantStatus {
				t.Errorf("status = %d, want %d", rec.Code, tc.wantStatus)
			}
			if diff := cmp.Diff(tc.want, decode[v1.Readiness](t, rec), cmpopts.IgnoreFields(v1.Check{}, "DurationMS")); diff != "" {
				t.Errorf("body (-want +got):\n%s", diff)
			}
		})
	}
}

func TestInfoAndMe(t *testing.T) {
	tests := []struct {
		name     string
		mode     Mode
		token    string
		wantInfo v1.Info
		wantMe   v1.Me
		wantHdr  string
	}{
		{
			name:     "production says nothing about simulation",
			token:    tokAlice,
			wantInfo: v1.Info{Service: "gpubroker", Version: "1.2.3", APIVersion: "v1", Mode: "production", OpenAPI: "/api/v1/openapi.yaml"},
			wantMe:   v1.Me{User: "alice", Groups: []string{"ml"}},
		},
		{
			name:     "dev mode says plainly that it is simulated",
			mode:     Mode{Simulated: true},
			token:    tokBob,
			wantInfo: v1.Info{Service: "gpubroker", Version: "1.2.3", APIVersion: "v1", Mode: "dev-simulated", Notice: DefaultSimulatedNotice, OpenAPI: "/api/v1/openapi.yaml"},
			wantMe:   v1.Me{User: "bob", Groups: []string{}, Notice: DefaultSimulatedNotice},
			wantHdr:  "dev-simulated",
		},
		{
			name:     "dev mode with its own notice; the hub",
			mode:     Mode{Simulated: true, Notice: "simulated DGX H200"},
			token:    tokHub,
			wantInfo: v1.Info{Service: "gpubroker", Version: "1.2.3", APIVersion: "v1", Mode: "dev-simulated", Notice: "simulated DGX H200", OpenAPI: "/api/v1/openapi.yaml"},
			wantMe:   v1.Me{User: "jupyterhub", Groups: []string{}, Hub: true, Notice: "simulated DGX H200"},
			wantHdr:  "dev-simulated",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, harnessConfig{mode: tc.mode})
			rec := h.do(t, req{method: http.MethodGet, path: "/api/v1/"})
			if diff := cmp.Diff(tc.wantInfo, decode[v1.Info](t, rec)); diff != "" {
				t.Errorf("info (-want +got):\n%s", diff)
			}
			if got := rec.Header().Get(v1.HeaderMode); got != tc.wantHdr {
				t.Errorf("info %s = %q, want %q", v1.HeaderMode, got, tc.wantHdr)
			}
			rec = h.do(t, req{method: http.MethodGet, path: "/api/v1/me", token: tc.token})
			if diff := cmp.Diff(tc.wantMe, decode[v1.Me](t, rec)); diff != "" {
				t.Errorf("me (-want +got):\n%s", diff)
			}
			if got := rec.Header().Get(v1.HeaderMode); got != tc.wantHdr {
				t.Errorf("me %s = %q, want %q", v1.HeaderMode, got, tc.wantHdr)
			}
		})
	}
}

func TestOpenAPIServed(t *testing.T) {
	h := newHarness(t)
	rec := h.do(t, req{method: http.MethodGet, path: "/api/v1/openapi.yaml"})
	if rec.Code != http.StatusOK || !strings.HasPrefix(rec.Body.String(), "openapi: 3.") {
		t.Errorf("status %d, body starts %q", rec.Code, rec.Body.String()[:min(20, rec.Body.Len())])
	}
	if got := rec.Header().Get("Content-Type"); got != "application/yaml" {
		t.Errorf("Content-Type = %q", got)
	}
}

func TestNewRefusesMissingDeps(t *testing.T) {
	_, err := New(Deps{Checkers: []Checker{nil}})
	if err == nil {
		t.Fatal("New with no deps: no error")
	}
	for _, want := range []string{"Servers", "Profiles", "Fleet", "Auth", "Log", "Checkers[0]"} {
		if !strings.Contains(err.Error(), "Deps."+want+" is nil") {
			t.Errorf("error does not name %s: %v", want, err)
		}
	}
	var joined interface{ Unwrap() []error }
	if !errors.As(err, &joined) || len(joined.Unwrap()) != 6 {
		t.Errorf("want 6 joined errors, got %v", err)
	}
}
