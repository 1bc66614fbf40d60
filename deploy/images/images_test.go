// Package images holds the tests of the container images' recipes
// (broker.Dockerfile, agent.Dockerfile and build.sh, which their build
// stages run). No container engine runs here, so the tests build what the
// images would hold with build.sh, check the binaries (go version -m, the
// hook's ELF header) and lint the Dockerfiles against those outputs and
// against the Helm chart that runs the images.
package images

import (
	"bufio"
	"debug/elf"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpubroker/gpubroker/deploy/helm/render"
)

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	op, args string
	line     int
}

// stage is one FROM … [AS name] of a Dockerfile and its instructions.
type stage struct {
	from, name string
	steps      []instruction
}

// parse reads a Dockerfile into stages.
func parse(t *testing.T, path string) []stage {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var stages []stage
	var cur strings.Builder
	start, n := 0, 0
	flush := func() {
		text := strings.TrimSpace(cur.String())
		cur.Reset()
		if text == "" {
			return
		}
		op, args, _ := strings.Cut(text, " ")
		in := instruction{op: strings.ToUpper(op), args: strings.TrimSpace(args), line: start}
		if in.op == "FROM" {
			f := strings.Fields(in.args)
			s := stage{from: f[0]}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				s.name = f[2]
			}
			stages = append(stages, s)
			return
		}
		if len(stages) == 0 {
			t.Fatalf("%s:%d: %s before FROM", path, start, in.op)
		}
		stages[len(stages)-1].steps = append(stages[len(stages)-1].steps, in)
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		n++
		line := sc.Text()
		if cur.Len() == 0 {
			if trimmed := strings.TrimSpace(line); trimmed == "" || strings.HasPrefix(trimmed, "#") {
				continue
			}
			start = n
		}
		if body, more := strings.CutSuffix(line, `\`); more {
			cur.WriteString(body + " ")
			continue
		}
		cur.WriteString(line)
		flush()
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	flush()
	return stages
}

// buildRun matches a build stage's call of build.sh.
var buildRun = regexp.MustCompile(`^deploy/images/build\.sh (\w+) (/\S+)$`)

// image is what a Dockerfile's final stage holds: each COPY --from's
// destination mapped to the build output it takes, and the final stage.
type image struct {
	final  stage
	copies map[string]string // destination → path of the output built here
}

// lint checks a Dockerfile against what build.sh built for each target
// into outs[target]: every build stage runs build.sh for one target into
// /out, and every COPY --from takes a file that target built.
func lint(t *testing.T, path string, outs map[string]string) image {
	t.Helper()
	stages := parse(t, path)
	targets := map[string]string{} // stage name → build.sh target
	for _, s := range stages[:len(stages)-1] {
		for _, in := range s.steps {
			if in.op != "RUN" {
				continue
			}
			if m := buildRun.FindStringSubmatch(in.args); m != nil {
				if m[2] != "/out" {
					t.Errorf("%s:%d: build.sh writes to %s, want /out", path, in.line, m[2])
				}
				targets[s.name] = m[1]
			}
		}
		if _, ok := targets[s.name]; !ok {
			t.Errorf("%s: build stage %q never runs deploy/images/build.sh", path, s.name)
		}
	}
	img := image{final: stages[len(stages)-1], copies: map[string]string{}}
	for _, in := range img.final.steps {
		if in.op != "COPY" {
			continue
		}
		f := strings.Fields(in.args)
		from, ok := strings.CutPrefix(f[0], "--from=")
		if !ok || len(f) != 3 {
			t.Errorf("%s:%d: COPY %s: the final stage copies only single build outputs (COPY --from=<stage> /out/<file> <dest>)", path, in.line, in.args)
			continue
		}
		target, ok := targets[from]
		if !ok {
			t.Errorf("%s:%d: COPY from %q, which is no build stage", path, in.line, from)
			continue
		}
		rel, ok := strings.CutPrefix(f[1], "/out/")
		built := filepath.Join(outs[target], rel)
		if _, err := os.Stat(built); !ok || err != nil {
			t.Errorf("%s:%d: COPY %s: build.sh %s does not make it (its outputs: %v)", path, in.line, f[1], target, list(t, outs[target]))
			continue
		}
		img.copies[f[2]] = built
	}
	return img
}

func list(t *testing.T, dir string) []string {
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, "/out/"+e.Name())
	}
	return names
}

// entrypoint returns the exec-form ENTRYPOINT of a stage.
func (s stage) entrypoint(t *testing.T) []string {
	t.Helper()
	var ep []string
	for _, in := range s.steps {
		if in.op == "ENTRYPOINT" {
			if err := json.Unmarshal([]byte(in.args), &ep); err != nil {
				t.Errorf("ENTRYPOINT %s: want the exec form [\"...\"]: %v", in.args, err)
			}
		}
	}
	return ep
}

func (s stage) last(op string) string {
	out := ""
	for _, in := range s.steps {
		if in.op == op {
			out = in.args
		}
	}
	return out
}

// build runs build.sh for target into a temporary directory.
func build(t *testing.T, target string) string {
	t.Helper()
	out := t.TempDir()
	cmd := exec.Command("deploy/images/build.sh", target, out)
	cmd.Dir = filepath.Join("..", "..")
	start := time.Now()
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build.sh %s: %v\n%s", target, err, b)
	}
	t.Logf("build.sh %s: %s", target, time.Since(start).Round(time.Millisecond))
	return out
}

// buildSettings returns the build settings `go version -m` prints.
func buildSettings(t *testing.T, bin string) map[string]string {
	t.Helper()
	out, err := exec.Command("go", "version", "-m", bin).Output()
	if err != nil {
		t.Fatalf("go version -m %s: %v", bin, err)
	}
	set := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && f[0] == "build" {
			if k, v, ok := strings.Cut(f[1], "="); ok {
				set[k] = v
			}
		}
	}
	return set
}

// goMinor is go.mod's go version as major.minor ("1.26").
func goMinor(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(b)
	if m == nil {
		t.Fatal("go.mod has no go line")
	}
	return string(m[1])
}

// TestBrokerImage: the broker image holds the static, cgo-free binary on a
// distroless base and runs it as the user the chart runs it as.
func TestBrokerImage(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds the broker")
	}
	out := build(t, "broker")
	img := lint(t, "broker.Dockerfile", map[string]string{"broker": out})
	set := buildSettings(t, filepath.Join(out, "gpubroker"))
	if set["CGO_ENABLED"] != "0" || set["-trimpath"] != "true" || set["GOOS"] != "linux" {
		t.Errorf("broker build settings CGO_ENABLED=%q -trimpath=%q GOOS=%q, want 0, true, linux", set["CGO_ENABLED"], set["-trimpath"], set["GOOS"])
	}
	if !strings.HasPrefix(img.final.from, "gcr.io/distroless/static") {
		t.Errorf("broker base %s, want a distroless static image", img.final.from)
	}
	ep := img.final.entrypoint(t)
	if len(ep) != 1 || img.copies[ep[0]] == "" || filepath.Base(img.copies[ep[0]]) != "gpubroker" {
		t.Errorf("ENTRYPOINT %q is not the copied gpubroker binary (copies %v)", ep, img.copies)
	}
	checkGoImage(t, "broker.Dockerfile")

	r, err := render.RenderExample("minimal")
	if err != nil {
		t.Fatal(err)
	}
	dep, err := r.Deployment("broker")
	if err != nil {
		t.Fatal(err)
	}
	psc := dep.Spec.Template.Spec.SecurityContext
	if user := img.final.last("USER"); psc.RunAsUser == nil || user != "65532:65532" || *psc.RunAsUser != 65532 || *psc.RunAsGroup != 65532 {
		t.Errorf("image USER %q; the chart runs the broker as %v:%v", user, psc.RunAsUser, psc.RunAsGroup)
	}
	if c := dep.Spec.Template.Spec.Containers[0]; len(c.Command) > 0 {
		t.Errorf("the chart overrides the image's ENTRYPOINT with %q", c.Command)
	}
}

// TestAgentImage: the agent image holds the cgo agent and the hook library
// on a glibc base with /bin/sh, at the paths the chart's DaemonSet uses.
func TestAgentImage(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds the agent")
	}
	outs := map[string]string{"agent": build(t, "agent"), "hook": build(t, "hook")}
	img := lint(t, "agent.Dockerfile", outs)
	set := buildSettings(t, filepath.Join(outs["agent"], "gpubroker-agent"))
	if set["CGO_ENABLED"] != "1" || set["-trimpath"] != "true" {
		t.Errorf("agent build settings CGO_ENABLED=%q -trimpath=%q, want 1 (go-nvml needs cgo) and true", set["CGO_ENABLED"], set["-trimpath"])
	}
	f, err := elf.Open(filepath.Join(outs["hook"], "libgpulimit.so"))
	if err != nil {
		t.Fatalf("hook: %v", err)
	}
	defer f.Close()
	soname, err := f.DynString(elf.DT_SONAME)
	if err != nil || f.Type != elf.ET_DYN || !slices.Equal(soname, []string{"libgpulimit.so"}) {
		t.Errorf("hook is ELF type %v with soname %v (%v), want a shared object libgpulimit.so", f.Type, soname, err)
	}
	base := strings.SplitN(img.final.from, ":", 2)[0]
	if base != "debian" && base != "ubuntu" {
		t.Errorf("agent base %s, want a glibc distribution with /bin/sh (Debian or Ubuntu)", img.final.from)
	}
	ep := img.final.entrypoint(t)
	if len(ep) != 1 || filepath.Base(img.copies[ep[0]]) != "gpubroker-agent" {
		t.Errorf("ENTRYPOINT %q is not the copied agent (copies %v)", ep, img.copies)
	}
	checkGoImage(t, "agent.Dockerfile")

	r, err := render.RenderExample("minimal")
	if err != nil {
		t.Fatal(err)
	}
	ds, err := r.DaemonSet("agent")
	if err != nil {
		t.Fatal(err)
	}
	ic := ds.Spec.Template.Spec.InitContainers[0]
	var source string
	for _, e := range ic.Env {
		if e.Name == "HOOK_SOURCE" {
			source = e.Value
		}
	}
	if filepath.Base(img.copies[source]) != "libgpulimit.so" {
		t.Errorf("the chart's init container copies %s, which the image does not hold (copies %v)", source, img.copies)
	}
	if len(ic.Command) == 0 || ic.Command[0] != "/bin/sh" || ic.Image != ds.Spec.Template.Spec.Containers[0].Image {
		t.Errorf("init container %q in %s: want /bin/sh in the agent image", ic.Command, ic.Image)
	}
	if c := ds.Spec.Template.Spec.Containers[0]; len(c.Command) > 0 {
		t.Errorf("the chart overrides the image's ENTRYPOINT with %q", c.Command)
	}
}

// checkGoImage: the Go build stages use go.mod's Go version.
func checkGoImage(t *testing.T, path string) {
	t.Helper()
	want := "golang:" + goMinor(t) + "-"
	for _, s := range parse(t, path) {
		if strings.HasPrefix(s.from, "golang:") && !strings.HasPrefix(s.from, want) {
			t.Errorf("%s: stage %s builds with %s; go.mod says go %s", path, s.name, s.from, goMinor(t))
		}
	}
}
