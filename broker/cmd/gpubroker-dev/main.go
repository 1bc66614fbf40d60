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
	"strings"
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
	switch {
	case errors.Is(err, cliconfig.ErrHelp):
		fmt.Fprint(stdout, dev.Usage())
		return 0
	case errors.Is(err, cliconfig.ErrVersion):
		fmt.Fprint(stdout, cliconfig.BuildInfo("gpubroker-dev"))
		return 0
	}
	for _, w := range warnings {
		fmt.Fprintf(stderr, "gpubroker-dev: warning: %s\n", w)
	}
	if cfg.Broker.CheckConfig {
		err = errors.Join(err, app.CheckConfig(cfg.Broker))
	}
	if err != nil {
		fmt.Fprintf(stderr, "gpubroker-dev: invalid configuration:\n  - %s\n", strings.ReplaceAll(err.Error(), "\n", "\n  - "))
		return 2
	}
	if cfg.Broker.CheckConfig {
		fmt.Fprintln(stdout, "gpubroker-dev: configuration is valid")
		return 0
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := dev.Run(ctx, cfg, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "gpubroker-dev: %v\n", err)
		return 1
	}
	return 0
}
