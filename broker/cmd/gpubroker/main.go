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
	check := cfg.CheckConfig || cfg.Connect
	if check && !errors.Is(err, cliconfig.ErrHelp) && !errors.Is(err, cliconfig.ErrVersion) {
		// Report the files' problems too, next to the flags' ones.
		err = errors.Join(err, app.CheckConfig(cfg))
	}
	var deps []cliconfig.Dependency
	if cfg.Connect {
		deps = app.Dependencies(cfg)
	}
	front := cliconfig.Front{Program: "gpubroker " + args[0], Usage: func() string { return config.Usage(mode) }, Stdout: stdout, Stderr: stderr}
	if code, done := front.Settle(context.Background(), warnings, err, check, deps); done {
		return code
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := app.Serve(ctx, cfg, stderr); err != nil {
		fmt.Fprintf(stderr, "gpubroker %s: %v\n", args[0], err)
		return 1
	}
	return 0
}
