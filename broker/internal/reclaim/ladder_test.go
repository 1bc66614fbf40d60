package reclaim

import (
	"testing"
	"time"
)

// TestDurationAndClockTextsAreExact: notices say how long to the second
// below an hour, never "0 min", and a time off the minute with its seconds.
func TestDurationAndClockTextsAreExact(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0: "0 s", 40 * time.Second: "40 s", 59999 * time.Millisecond: "59 s", time.Minute: "1 min",
		4*time.Minute + 20*time.Second: "4 min 20 s", 42 * time.Minute: "42 min", 2*time.Hour + 5*time.Minute + 9*time.Second: "2 h 5 min",
		3 * time.Hour: "3 h", 76 * time.Hour: "3 d 4 h", -time.Second: "0 s",
	} {
		if got := durationText(d); got != want {
			t.Errorf("durationText(%s) = %q, want %q", d, got, want)
		}
	}
	now := time.Date(2026, 12, 1, 15, 29, 0, 0, time.UTC)
	for at, want := range map[time.Time]string{
		now.Add(time.Minute):                "15:30 UTC",
		now.Add(40 * time.Second):           "15:29:40 UTC",
		now.Add(24*time.Hour + time.Minute): "Dec 2 15:30 UTC",
		now.Add(1500 * time.Millisecond):    "15:29:01 UTC",
	} {
		if got := clockText(at, now); got != want {
			t.Errorf("clockText(%s) = %q, want %q", at.Format(time.TimeOnly), got, want)
		}
	}
}
