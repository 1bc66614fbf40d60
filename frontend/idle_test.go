package frontend_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestServerPageShowsTheIdleStateAndCountdown(t *testing.T) {
	since, next, until := t0.Add(-42*time.Minute), t0.Add(18*time.Minute), t0.Add(time.Hour)
	tests := []struct {
		name            string
		idle            *answer
		wantState, want string
	}{
		{name: "idle with a stop ahead", idle: &answer{200, map[string]any{"verdict": "idle", "since": since, "exempt": false, "nextAction": "stop", "nextAt": next, "extendedSeconds": 0}},
			wantState: "Idle for 42 min (since 14:18 UTC).", want: "If it stays idle, it stops (your files are kept) at 15:18 UTC unless extended."},
		{name: "active with the reason", idle: &answer{200, map[string]any{"verdict": "active", "reason": "a kernel is running code", "exempt": false, "extendedSeconds": 0}},
			wantState: "Active: a kernel is running code.", want: "None: nothing is scheduled."},
		{name: "unknown with the reason", idle: &answer{200, map[string]any{"verdict": "unknown", "reason": "notebook activity probe failed: api/status answered 502 Bad Gateway", "exempt": false, "extendedSeconds": 0}},
			wantState: "Unknown: notebook activity probe failed: api/status answered 502 Bad Gateway. Unknown never counts as idle.", want: "None: nothing is scheduled."},
		{name: "extended", idle: &answer{200, map[string]any{"verdict": "idle", "since": since, "exempt": false, "extendedUntil": until, "extendedSeconds": 3600}},
			wantState: "Idle for 42 min (since 14:18 UTC).", want: "Extended: no idle action before 16:00 UTC."},
		{name: "exempt", idle: &answer{200, map[string]any{"verdict": "idle", "since": since, "exempt": true, "extendedSeconds": 0}},
			wantState: "Idle for 42 min (since 14:18 UTC).", want: "None: this server is exempt from idle reclaim."},
		{name: "not checked yet", idle: &answer{200, map[string]any{"verdict": "unchecked", "exempt": false, "extendedSeconds": 0}},
			wantState: "Not checked yet: the reclaimer looks at running servers every half minute or so.", want: "None: nothing is scheduled."},
		{name: "the API cannot answer", idle: nil,
			wantState: "The idle state cannot be read right now.", want: "Unknown."},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := baseAnswers()
			if tc.idle != nil {
				a["GET /api/v1/users/alice/servers/nb/idle"] = *tc.idle
			}
			body := newSite(t, fakeSessions{v: alice}, a).do(t, "GET", "/servers/nb", nil).Body.String()
			got := [2]string{between(body, `<dd id="idle-state">`, "</dd>"), between(body, `<dd id="reclaim-countdown">`, "</dd>")}
			want := [2]string{htmlText(tc.wantState), htmlText(tc.want)}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func between(s, from, to string) string {
	_, rest, ok := strings.Cut(s, from)
	if !ok {
		return ""
	}
	out, _, _ := strings.Cut(rest, to)
	return out
}

// htmlText escapes what html/template escapes in these texts.
func htmlText(s string) string {
	return strings.ReplaceAll(s, "'", "&#39;")
}
