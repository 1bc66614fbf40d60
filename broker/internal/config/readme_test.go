package config_test

import (
	"flag"
	"testing"

	"github.com/gpubroker/gpubroker/broker/internal/config"
	"github.com/gpubroker/gpubroker/limiter/cliconfig/cliconfigtest"
)

var update = flag.Bool("update", false, "rewrite the README's configuration table")

// TestREADMEConfigurationTableIsTheFlagTable keeps the README's table of
// gpubroker serve's flags equal to the flags themselves.
func TestREADMEConfigurationTableIsTheFlagTable(t *testing.T) {
	c := config.Config{Mode: config.ModeServe}
	cliconfigtest.CheckMarkdown(t, "../../../README.md", "gpubroker serve", c.Table(), *update)
}
