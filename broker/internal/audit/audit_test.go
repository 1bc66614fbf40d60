package audit_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/audit"
)

func TestCursor(t *testing.T) {
	tests := []struct {
		in     string
		want   audit.Cursor
		wantOK bool
	}{
		{"17-0,+", audit.Cursor{Reclaim: "17-0"}, true},
		{"+,18-3", audit.Cursor{Agent: "18-3"}, true},
		{"17-0,18-3", audit.Cursor{Reclaim: "17-0", Agent: "18-3"}, true},
		{"1764428400000-0", audit.Cursor{Reclaim: "1764428400000-0", Agent: "1764428400000-0"}, true},
		{"x", audit.Cursor{}, false},
		{"17-0,x", audit.Cursor{}, false},
		{"17,18-0", audit.Cursor{}, false},
		{"", audit.Cursor{}, false},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, ok := audit.ParseCursor(tc.in)
			if ok != tc.wantOK || (ok && got != tc.want) {
				t.Errorf("ParseCursor(%q) = %+v %v, want %+v %v", tc.in, got, ok, tc.want, tc.wantOK)
			}
			if back, _ := audit.ParseCursor(got.String()); ok && back != got {
				t.Errorf("%+v does not survive its text form %q", got, got.String())
			}
		})
	}
}

func TestLess(t *testing.T) {
	for _, c := range [][2]string{{"9-0", "10-0"}, {"10-1", "10-2"}, {"10-9", "11-0"}} {
		if !audit.Less(c[0], c[1]) || audit.Less(c[1], c[0]) {
			t.Errorf("%s < %s is not so", c[0], c[1])
		}
	}
	if audit.Less("10-0", "10-0") {
		t.Error("an id is older than itself")
	}
}

func TestQueryMatches(t *testing.T) {
	e := audit.Entry{Source: v1.AuditSourceAgent, Actor: "gpubroker-agent@n1", Action: "agent.kill", Target: "pod:ns/p"}
	var got []bool
	for _, q := range []audit.Query{{}, {Source: v1.AuditSourceAgent}, {Source: v1.AuditSourceReclaim}, {Actor: "GPUBROKER-AGENT@N1"},
		{Action: "agent.report"}, {Target: "pod:ns/p"}, {User: "ada"}} {
		got = append(got, q.Matches(e))
	}
	if diff := cmp.Diff([]bool{true, true, false, true, false, true, false}, got); diff != "" {
		t.Errorf("matches (-want +got):\n%s", diff)
	}
	s := audit.Entry{Source: v1.AuditSourceServers, Actor: "jupyterhub", Action: "server.create", Target: audit.ServerTarget("ada", "nb")}
	got = nil
	for _, q := range []audit.Query{{User: "ada"}, {User: "ada", Server: "nb"}, {User: "ada", Server: "n"}, {User: "ad"},
		{User: "ada", Server: "nb", Source: v1.AuditSourceServers}, {User: "bob", Server: "nb"}} {
		got = append(got, q.Matches(s))
	}
	if diff := cmp.Diff([]bool{true, true, false, false, true, false}, got); diff != "" {
		t.Errorf("matches by user and server (-want +got):\n%s", diff)
	}
}
