package cliconfig

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"
)

// Dependency is one outside part that --check-config --connect contacts.
type Dependency struct {
	// Name is how the output names it: "redis", "oidc", "kubernetes".
	Name string
	// Where says which one, without secrets ("redis://r:6379/0").
	Where string
	// Check contacts it and returns nil when it answered as it should; nil
	// means there is nothing to contact (dev mode embeds it).
	Check func(ctx context.Context) error
}

// ConnectTimeout bounds each dependency's check.
const ConnectTimeout = 10 * time.Second

// Connect checks every dependency at once, each within ConnectTimeout, and
// writes one line per dependency to w in the given order: "ok" with the
// time it took, "FAILED" with the error, or "-" for one without a Check.
// The error names every failed dependency.
func Connect(ctx context.Context, w io.Writer, deps []Dependency) error {
	type result struct {
		err  error
		took time.Duration
	}
	results := make([]result, len(deps))
	var wg sync.WaitGroup
	for i, d := range deps {
		if d.Check == nil {
			continue
		}
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, ConnectTimeout)
			defer cancel()
			start := time.Now()
			err := d.Check(cctx)
			results[i] = result{err: err, took: time.Since(start)}
		})
	}
	wg.Wait()
	var errs []error
	for i, d := range deps {
		r := results[i]
		if d.Check == nil {
			fmt.Fprintf(w, "connect: %-10s -       %s (nothing to contact)\n", d.Name, d.Where)
			continue
		}
		if r.err != nil {
			fmt.Fprintf(w, "connect: %-10s FAILED  %s: %v\n", d.Name, d.Where, r.err)
			errs = append(errs, fmt.Errorf("%s (%s) does not answer: %w", d.Name, d.Where, r.err))
			continue
		}
		fmt.Fprintf(w, "connect: %-10s ok      %s answered in %s\n", d.Name, d.Where, r.took.Round(time.Millisecond))
	}
	return errors.Join(errs...)
}
