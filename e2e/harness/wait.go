package harness

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrTimeout is returned (wrapped) by Poll when the condition did not hold
// before the deadline.
var ErrTimeout = errors.New("timed out")

// Condition reports whether a wait is over: done is true when it is; a
// non-nil err stops the wait with that error; otherwise status may describe
// the current state, and Poll puts the last status into its timeout error.
type Condition func(ctx context.Context) (done bool, status string, err error)

// Poll calls cond at once and then every interval until cond reports done,
// cond returns an error, ctx ends or timeout passes. On timeout the error
// wraps ErrTimeout and carries cond's last status.
func Poll(ctx context.Context, interval, timeout time.Duration, cond Condition) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		done, status, err := cond(ctx)
		if err != nil {
			return err
		}
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("after %s (last: %s): %w", timeout, status, ErrTimeout)
			}
			return fmt.Errorf("last: %s: %w", status, ctx.Err())
		case <-ticker.C:
		}
	}
}

// PollProgress calls cond at once and then every interval until cond
// reports done, cond returns an error or ctx ends, as Poll does, but has no
// deadline of its own: it fails only when cond's status has stayed the
// same for stall, that is when nothing cond watches moved. cond's status
// must therefore describe the progress of what is waited for (states,
// messages, counts) and nothing that changes by itself (no times). On a
// stall the error wraps ErrTimeout and carries the last status.
func PollProgress(ctx context.Context, interval, stall time.Duration, cond Condition) error {
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	last, since := "", time.Now()
	for first := true; ; first = false {
		done, status, err := cond(ctx)
		if err != nil {
			return err
		}
		if done {
			return nil
		}
		if first || status != last {
			last, since = status, time.Now()
		} else if time.Since(since) >= stall {
			return fmt.Errorf("no progress for %s (last: %s): %w", stall, status, ErrTimeout)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("last: %s: %w", status, ctx.Err())
		case <-ticker.C:
		}
	}
}
