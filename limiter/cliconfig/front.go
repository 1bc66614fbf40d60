package cliconfig

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Front is how every gpubroker binary answers its command line before it
// starts: help, version, warnings, problems, --check-config and --connect.
type Front struct {
	// Program names the binary in its output: "gpubroker serve".
	Program string
	// Usage returns the --help text.
	Usage func() string
	// Stdout gets help, version and check results; Stderr warnings and
	// problems.
	Stdout, Stderr io.Writer
}

// Settle acts on what Load returned (err joined with any checks of the
// files the configuration names). It returns done and the exit code when
// the program stops here: 0 after --help, --version or a passed check; 2
// when the configuration has problems (every one printed, one per line);
// 1 when a dependency did not answer. check is --check-config; deps, when
// not nil, are contacted as for --connect (which implies check). Warnings
// are printed first, whatever happens next.
func (f Front) Settle(ctx context.Context, warnings []string, err error, check bool, deps []Dependency) (code int, done bool) {
	switch {
	case errors.Is(err, ErrHelp):
		fmt.Fprint(f.Stdout, f.Usage())
		return 0, true
	case errors.Is(err, ErrVersion):
		fmt.Fprint(f.Stdout, BuildInfo(strings.Fields(f.Program)[0]))
		return 0, true
	}
	for _, w := range warnings {
		fmt.Fprintf(f.Stderr, "%s: warning: %s\n", f.Program, w)
	}
	if err != nil {
		fmt.Fprintf(f.Stderr, "%s: invalid configuration:\n  - %s\n", f.Program, strings.ReplaceAll(err.Error(), "\n", "\n  - "))
		return 2, true
	}
	if !check && deps == nil {
		return 0, false
	}
	fmt.Fprintf(f.Stdout, "%s: configuration is valid\n", f.Program)
	if deps != nil {
		if err := Connect(ctx, f.Stdout, deps); err != nil {
			fmt.Fprintf(f.Stderr, "%s: %d of %d dependencies do not answer (see above)\n", f.Program, len(Split(err)), len(deps))
			return 1, true
		}
	}
	return 0, true
}
