package cliconfig

import (
	"runtime/debug"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestBuildInfoNamesVersionToolchainRevisionAndPlatform(t *testing.T) {
	bi := &debug.BuildInfo{
		GoVersion: "go1.26.8",
		Main:      debug.Module{Path: "github.com/gpubroker/gpubroker", Version: "v1.2.3"},
		Settings: []debug.BuildSetting{
			{Key: "GOOS", Value: "linux"}, {Key: "GOARCH", Value: "amd64"}, {Key: "CGO_ENABLED", Value: "0"},
			{Key: "vcs.revision", Value: "42c2f83"}, {Key: "vcs.time", Value: "2026-12-01T10:00:00Z"},
			{Key: "vcs.modified", Value: "true"}, {Key: "-race", Value: "true"},
		},
	}
	want := `gpubroker v1.2.3
  go        go1.26.8
  module    github.com/gpubroker/gpubroker
  revision  42c2f83 (modified)
  time      2026-12-01T10:00:00Z
  platform  linux/amd64, CGO_ENABLED=0, race detector on
`
	if diff := cmp.Diff(want, formatBuildInfo("gpubroker", bi)); diff != "" {
		t.Errorf("build info (-want +got):\n%s", diff)
	}
	bi = &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "m", Version: "(devel)"}}
	want = "gpubroker-agent devel\n  go        go1.26.8\n  module    m\n  platform  unknown, CGO_ENABLED=unknown\n"
	if diff := cmp.Diff(want, formatBuildInfo("gpubroker-agent", bi)); diff != "" {
		t.Errorf("devel build info (-want +got):\n%s", diff)
	}
}
