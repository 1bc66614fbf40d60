package dev

import (
	"fmt"

	"github.com/gpubroker/gpubroker/broker/internal/config"
	"github.com/gpubroker/gpubroker/limiter/cliconfig"
)

// Config is gpubroker-dev's configuration: the broker's (in dev mode, where
// Redis, the issuer, the cluster and the profiles are optional) and the
// number of simulated GPUs.
type Config struct {
	Broker config.Config
	// GPUs is the number of simulated H200 GPUs, 1..64. Default 8.
	GPUs int
	// Notebooks is "auto" (default: real Jupyter servers through the pod
	// runner when one is installed here, else simulated pods) or
	// "simulated" (pods that run nothing, as without Jupyter).
	Notebooks string
}

// Table is gpubroker-dev's flag table bound to c: the broker's flags in dev
// mode, then --dev-gpus.
func (c *Config) Table() *cliconfig.Table {
	c.Broker.Mode = config.ModeDev
	t := c.Broker.Table()
	t.Program = "gpubroker-dev"
	t.Summary = `gpubroker-dev runs the whole product locally in one process: the real broker
with an embedded Redis, an embedded OIDC issuer, the embedded profiles, a
simulated cluster and simulated NVIDIA H200 GPUs, each unless the flags below
name a real one. It says so in its log, its banner and every API answer.`
	t.Flags = append(t.Flags, cliconfig.Flag{Name: "dev-gpus", Placeholder: "N", Value: cliconfig.Int(&c.GPUs), Default: "8",
		Help: "Number of simulated NVIDIA H200 GPUs, 1..64.",
		Check: func() error {
			if c.GPUs < 1 || c.GPUs > 64 {
				return fmt.Errorf("must be 1..64, got %d", c.GPUs)
			}
			return nil
		}},
		cliconfig.Flag{Name: "dev-notebooks", Placeholder: "HOW", Value: cliconfig.String(&c.Notebooks), Default: "auto",
			Help: "auto: with the simulated cluster, run each notebook pod as a real local Jupyter server (Debian's python3-notebook under /usr/bin/python3, or python3 with the notebook module) when one is installed, else simulate; simulated: pods run nothing.",
			Check: func() error {
				if c.Notebooks != "auto" && c.Notebooks != "simulated" {
					return fmt.Errorf("must be auto or simulated, got %q", c.Notebooks)
				}
				return nil
			}})
	return t
}

// Load parses args over environ (os.Environ()) over the defaults and
// validates, as config.Load does for the broker: cliconfig.ErrHelp or
// ErrVersion when args ask for them, else every problem at once, and
// warnings for GPUBROKER_ variables no flag reads.
func Load(args, environ []string) (Config, []string, error) {
	var c Config
	warnings, err := c.Table().Load(args, environ)
	return c, warnings, err
}

// Usage is gpubroker-dev's --help text.
func Usage() string {
	var c Config
	return c.Table().Usage()
}

// Embedded names the outside parts c leaves to dev mode ("redis", "oidc",
// "kubernetes"), in app.Dependencies' terms.
func Embedded(c Config) []string {
	var out []string
	if c.Broker.Redis.URL == "" && c.Broker.Redis.SentinelMaster == "" {
		out = append(out, "redis")
	}
	if c.Broker.OIDCIssuer == "" {
		out = append(out, "oidc")
	}
	if c.Broker.Kube.Kubeconfig == "" {
		out = append(out, "kubernetes")
	}
	return out
}
