package main

import (
	"flag"
	"testing"

	"github.com/gpubroker/gpubroker/limiter/cliconfig/cliconfigtest"
)

var update = flag.Bool("update", false, "rewrite the README's configuration table")

// TestREADMEConfigurationTableIsTheFlagTable keeps the README's table of
// the agent's flags equal to the flags themselves.
func TestREADMEConfigurationTableIsTheFlagTable(t *testing.T) {
	var c Config
	cliconfigtest.CheckMarkdown(t, "../../../README.md", "gpubroker-agent", c.table(), *update)
}
