package cliconfig

import (
	"fmt"
	"runtime/debug"
	"strings"
)

// Version is the module version the binary was built from (a tag, or a
// pseudo-version), or "devel" for a build from a work tree.
func Version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "devel"
	}
	return moduleVersion(bi)
}

func moduleVersion(bi *debug.BuildInfo) string {
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	return "devel"
}

// BuildInfo is what --version prints: the program and version, then the
// Go toolchain, the VCS revision and its time (marked modified for a dirty
// tree), the platform and whether cgo and the race detector are in.
func BuildInfo(program string) string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return program + " devel (no build information)\n"
	}
	return formatBuildInfo(program, bi)
}

func formatBuildInfo(program string, bi *debug.BuildInfo) string {
	set := map[string]string{}
	for _, s := range bi.Settings {
		set[s.Key] = s.Value
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s\n", program, moduleVersion(bi))
	fmt.Fprintf(&b, "  go        %s\n", bi.GoVersion)
	fmt.Fprintf(&b, "  module    %s\n", bi.Main.Path)
	if rev := set["vcs.revision"]; rev != "" {
		if set["vcs.modified"] == "true" {
			rev += " (modified)"
		}
		fmt.Fprintf(&b, "  revision  %s\n", rev)
	}
	if t := set["vcs.time"]; t != "" {
		fmt.Fprintf(&b, "  time      %s\n", t)
	}
	platform := set["GOOS"] + "/" + set["GOARCH"]
	if platform == "/" {
		platform = "unknown"
	}
	cgo := set["CGO_ENABLED"]
	if cgo == "" {
		cgo = "unknown"
	}
	race := ""
	if set["-race"] == "true" {
		race = ", race detector on"
	}
	fmt.Fprintf(&b, "  platform  %s, CGO_ENABLED=%s%s\n", platform, cgo, race)
	return b.String()
}
