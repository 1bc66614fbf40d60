// Command gpubroker is the gpubroker broker: the REST API, placement of GPU
// slices, notebook pods and their reconciliation.
//
//	gpubroker serve [flags]   run against a real cluster and Redis
//	gpubroker version         print the version and build information
//
// Every flag has a GPUBROKER_* environment twin; `gpubroker serve --help`
// lists them. This file only parses, validates and hands over to the app.
//
// This is the production binary: it links no simulation (no embedded
// Redis, fake clientset, NVML mocks or token minting) and builds with
// CGO_ENABLED=0 (binary_test.go checks both). Dev mode, which simulates the
// cluster and the GPUs, is its own binary, gpubroker-dev.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/gpubroker/gpubroker/broker/internal/app"
	"github.com/gpubroker/gpubroker/broker/internal/config"
	"github.com/gpubroker/gpubroker/limiter/cliconfig"
)

const usage = `gpubroker gives developers small, elastic slices of NVIDIA GPUs for notebooks.

Usage:
  gpubroker serve [flags]   run the broker against a Kubernetes cluster and Redis
  gpubroker version         print the version and build information

Run 'gpubroker serve --help' for the flags; every flag can also be set through
its GPUBROKER_* environment variable. To run the whole product locally on
embedded defaults (simulated cluster and GPUs), use gpubroker-dev:
'go tool task dev' in a checkout.
`

// devMoved answers `gpubroker dev`, which became its own binary.
const devMoved = `gpubroker: dev mode is its own binary now, gpubroker-dev, so that this one
(the production broker) carries no simulation. Run it with
  go tool task dev [-- flags]
or
  go run ./broker/cmd/gpubroker-dev [flags]
It takes the same flags as 'gpubroker dev' did.
`

func main() {
	os.Exit(run(os.Args[1:], os.Environ(), os.Stdout, os.Stderr))
}

func run(args, environ []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stdout, usage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	mode := config.ModeServe
	switch args[0] {
	case "serve":
	case "dev":
		fmt.Fprint(stderr, devMoved)
		return 2
	case "version", "--version", "-version":
		fmt.Fprint(stdout, cliconfig.BuildInfo("gpubroker"))
		return 0
	default:
		fmt.Fprintf(stderr, "gpubroker: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	cfg, warnings, err := config.Load(mode, args[1:], environ)
	switch {
	case errors.Is(err, cliconfig.ErrHelp):
		fmt.Fprint(stdout, config.Usage(mode))
		return 0
	case errors.Is(err, cliconfig.ErrVersion):
		fmt.Fprint(stdout, cliconfig.BuildInfo("gpubroker"))
		return 0
	}
	for _, w := range warnings {
		fmt.Fprintf(stderr, "gpubroker %s: warning: %s\n", args[0], w)
	}
	if cfg.CheckConfig {
		// Report the files' problems too, next to the flags' ones.
		err = errors.Join(err, app.CheckConfig(cfg))
	}
	if err != nil {
		fmt.Fprintf(stderr, "gpubroker %s: invalid configuration:\n%s", args[0], indent(err))
		return 2
	}
	if cfg.CheckConfig {
		fmt.Fprintf(stdout, "gpubroker %s: configuration is valid\n", args[0])
		return 0
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := app.Serve(ctx, cfg, stderr); err != nil {
		fmt.Fprintf(stderr, "gpubroker %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

// indent prints each problem on its own line, flattening joined errors at
// every depth.
func indent(err error) string {
	var b strings.Builder
	var walk func(error)
	walk = func(e error) {
		if joined, ok := e.(interface{ Unwrap() []error }); ok && isJoin(e) {
			for _, inner := range joined.Unwrap() {
				walk(inner)
			}
			return
		}
		for _, line := range strings.Split(e.Error(), "\n") {
			b.WriteString("  - " + line + "\n")
		}
	}
	walk(err)
	return b.String()
}

// isJoin reports whether err came from errors.Join (whose text is just its
// parts' texts on separate lines), as opposed to an fmt.Errorf with several
// %w, whose text carries its own words.
func isJoin(err error) bool {
	joined, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return false
	}
	var parts []string
	for _, e := range joined.Unwrap() {
		parts = append(parts, e.Error())
	}
	return err.Error() == strings.Join(parts, "\n")
}
