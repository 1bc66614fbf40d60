// Command gpubroker-dev runs the whole gpubroker product locally on
// embedded defaults: the real broker with an embedded Redis and OIDC issuer,
// a simulated cluster and simulated NVIDIA H200 GPUs (see
// broker/internal/app/dev). `go tool task dev` runs it.
//
//	gpubroker-dev [flags]
//
// It takes the broker's flags (each optional: what is not set is embedded
// or simulated) and --dev-gpus; `gpubroker-dev --help` lists them. This
// file only parses, validates and hands over to the dev composition.
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
	"github.com/gpubroker/gpubroker/broker/internal/app/dev"
	"github.com/gpubroker/gpubroker/limiter/cliconfig"
)

func main() {
	os.Exit(run(os.Args[1:], os.Environ(), os.Stdout, os.Stderr))
}

func run(args, environ []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "dev" {
		args = args[1:] // `gpubroker-dev dev`, as `gpubroker dev` was typed
	}
	cfg, warnings, err := dev.Load(args, environ)
	check := cfg.Broker.CheckConfig || cfg.Broker.Connect
	if check && !errors.Is(err, cliconfig.ErrHelp) && !errors.Is(err, cliconfig.ErrVersion) {
		err = errors.Join(err, app.CheckConfig(cfg.Broker))
	}
	var deps []cliconfig.Dependency
	if cfg.Broker.Connect {
		deps = app.Dependencies(cfg.Broker, dev.Embedded(cfg)...)
	}
	front := cliconfig.Front{Program: "gpubroker-dev", Usage: dev.Usage, Stdout: stdout, Stderr: stderr}
	if code, done := front.Settle(context.Background(), warnings, err, check, deps); done {
		return code
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := dev.Run(ctx, cfg, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "gpubroker-dev: %v\n", err)
		return 1
	}
	return 0
}
