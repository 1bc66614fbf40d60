package reclaim

import (
	"fmt"
	"time"
)

// rung is one step of the idle ladder: at idle time At, do Action. A warn
// rung announces Next (the action that follows it), or nothing when it is
// the last rung (the warn-only policy).
type rung struct {
	At     time.Duration
	Action Action
	Next   Action
	NextAt time.Duration
}

// ladder returns the rungs of p (an effective policy) in order:
//
//	warn:   warn at IdleAfter
//	shrink: warn at IdleAfter-Warn (if Warn > 0), shrink at IdleAfter, and
//	        when StopAfter > 0: warn at StopAfter-Warn, stop at StopAfter
//	stop:   warn at IdleAfter-Warn (if Warn > 0), stop at IdleAfter
func ladder(p Policy) []rung {
	var out []rung
	step := func(at time.Duration, a Action) {
		if p.Warn > 0 {
			out = append(out, rung{At: at - p.Warn, Action: ActionWarn, Next: a, NextAt: at})
		}
		out = append(out, rung{At: at, Action: a})
	}
	switch p.Action {
	case ActionWarn:
		out = append(out, rung{At: p.IdleAfter, Action: ActionWarn})
	case ActionShrink:
		step(p.IdleAfter, ActionShrink)
		if p.StopAfter > 0 {
			step(p.StopAfter, ActionStop)
		}
	case ActionStop:
		step(p.IdleAfter, ActionStop)
	}
	return out
}

// clockText formats t for users: "15:30 UTC", or "15:30:40 UTC" when t is
// not on a whole minute (so a stop 40 s away is not "at 15:30"), with the
// date when it is not on now's day.
func clockText(t, now time.Time) string {
	t, now = t.UTC().Truncate(time.Second), now.UTC()
	layout := "15:04"
	if t.Second() != 0 {
		layout = "15:04:05"
	}
	if t.YearDay() != now.YearDay() || t.Year() != now.Year() {
		layout = "Jan 2 " + layout
	}
	return t.Format(layout + " UTC")
}

// durationText formats d for users, exactly to the second below an hour:
// "40 s", "4 min 20 s", "42 min", "2 h 5 min", "3 d 4 h". Never "0 min".
func durationText(d time.Duration) string {
	sec := int64(max(d, 0) / time.Second)
	m := sec / 60
	switch {
	case sec < 60:
		return fmt.Sprintf("%d s", sec)
	case m < 60:
		if sec%60 == 0 {
			return fmt.Sprintf("%d min", m)
		}
		return fmt.Sprintf("%d min %d s", m, sec%60)
	case m < 24*60:
		if m%60 == 0 {
			return fmt.Sprintf("%d h", m/60)
		}
		return fmt.Sprintf("%d h %d min", m/60, m%60)
	default:
		return fmt.Sprintf("%d d %d h", m/(24*60), (m/60)%24)
	}
}

// warnText is the event a warn rung writes.
func warnText(idle time.Duration, next Action, at time.Time, shrinkPercent int, now time.Time) string {
	switch next {
	case ActionStop:
		return fmt.Sprintf("idle for %s; will stop at %s unless extended (your files are kept)", durationText(idle), clockText(at, now))
	case ActionShrink:
		return fmt.Sprintf("idle for %s; compute will shrink to %d %% at %s unless extended", durationText(idle), shrinkPercent, clockText(at, now))
	default:
		return fmt.Sprintf("idle for %s; please stop the server if you no longer need it", durationText(idle))
	}
}
