// Package e2e holds gpubroker's end-to-end tests: a real etcd, kube-apiserver
// and kwok shared by the whole `go test` process, and for each test its own
// namespace, kwok nodes, redis-server, OIDC issuer and gpubroker process.
// The tests use only public interfaces: the gpubroker binary, its REST API
// (broker/api/v1), client-go, and the public test helpers broker/redistest and
// broker/devissuer.
//
// The tools come from `go tool task e2e:tools` (e2e/.bin). Without them, or
// without redis-server, the tests fail naming what is missing and how to get
// it; `go test -short` skips them.
//
// Environment:
//   - E2E_GPUBROKER_BIN=<path> tests a prebuilt gpubroker binary instead of
//     building ./broker/cmd/gpubroker; E2E_GPUBROKER_DEV_BIN the same for
//     gpubroker-dev, E2E_GPUBROKER_AGENT_BIN for gpubroker-agent.
//   - E2E_ARTIFACTS=<dir> receives the logs of failed runs (broker logs of
//     failed tests, the cluster's logs when the package failed).
package e2e

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gpubroker/gpubroker/e2e/harness"
)

// suite is the state TestMain sets up once for all tests; read-only while
// tests run (the broker builds are guarded by their own sync.Once).
var suite struct {
	skipReason string // set: -short
	missing    error  // set: the tools are missing
	startErr   error  // set: the cluster failed to start
	cluster    *harness.Cluster
	tools      harness.Tools
	dir        string

	race  binary // gpubroker built with -race (used when this binary has it)
	plain binary // gpubroker built without -race
	dev   binary // gpubroker-dev built without -race, as `go tool task dev` runs it
	agent binary // gpubroker-agent built without -race (cgo: go-nvml)
}

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	flag.Parse()
	if job := os.Getenv(rawCreatorEnv); job != "" {
		// This process is BenchmarkBrokerCost's plain client-go creator.
		if err := runRawCreator(job); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: plain pod creator: %s\n", err)
			return 1
		}
		return 0
	}
	suite.dev.pkg, suite.dev.env = "gpubroker-dev", "E2E_GPUBROKER_DEV_BIN"
	suite.agent.pkg, suite.agent.env, suite.agent.dir = "gpubroker-agent", "E2E_GPUBROKER_AGENT_BIN", "./limiter/cmd/"
	if testing.Short() {
		suite.skipReason = "e2e tests do not run with -short"
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "gpubroker-e2e-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: temp dir: %s\n", err)
		return 1
	}
	suite.dir = dir
	if tools, err := harness.FindTools(".bin"); err != nil {
		suite.missing = err
	} else {
		suite.tools = tools
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		start := time.Now()
		suite.cluster, suite.startErr = harness.StartCluster(ctx, tools, dir)
		cancel()
		if suite.startErr == nil {
			fmt.Fprintf(os.Stderr, "e2e: cluster ready in %s at %s (logs in %s)\n", time.Since(start).Round(time.Millisecond), suite.cluster.URL, dir)
		}
	}

	code := m.Run()

	if suite.cluster != nil {
		if code != 0 {
			fmt.Fprintf(os.Stderr, "e2e: failed; cluster logs:\n%s", suite.cluster.LogTails(40))
			for _, name := range []string{"etcd.log", "kube-apiserver.log", "kwok.log"} {
				if err := keepArtifact(filepath.Join(dir, name), "cluster-"+name); err != nil {
					fmt.Fprintf(os.Stderr, "e2e: %s\n", err)
				}
			}
		}
		if err := suite.cluster.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: stop cluster: %s\n", err)
			code = 1
		}
	}
	// Keep the cluster's logs of a failed run; nothing else in dir is worth it.
	if code == 0 || (suite.cluster == nil && suite.startErr == nil) {
		_ = os.RemoveAll(dir)
	} else {
		// The etcd data and the binaries are large (about 200 MB); drop them.
		for _, big := range []string{"etcd-data", "gpubroker", "gpubroker-race", "gpubroker-dev", "gpubroker-agent"} {
			_ = os.RemoveAll(filepath.Join(dir, big))
		}
		fmt.Fprintf(os.Stderr, "e2e: logs kept in %s\n", dir)
	}
	if code == 0 {
		// Every process and goroutine a test started must be gone by now.
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: leaked goroutines: %s\n", err)
			code = 1
		}
	}
	return code
}

// needCluster returns the shared cluster; it skips t under -short and
// fails it when the tools are missing or the cluster did not start.
func needCluster(t testing.TB) *harness.Cluster {
	t.Helper()
	if suite.skipReason != "" {
		t.Skipf("%s", suite.skipReason)
	}
	if suite.missing != nil {
		t.Fatalf("%v (`go tool task test` builds the tools and checks the packages first)", suite.missing)
	}
	if suite.startErr != nil {
		t.Fatalf("e2e: cluster did not start: %v", suite.startErr)
	}
	return suite.cluster
}

// brokerBinary returns the gpubroker binary the broker tests run: built
// once per test process from ./broker/cmd/gpubroker, with -race when this
// test binary has it, so the race detector also watches the broker.
func brokerBinary(t testing.TB) string {
	t.Helper()
	if !raceEnabled {
		return plainBrokerBinary(t)
	}
	return suite.race.get(t, true)
}

// plainBrokerBinary returns gpubroker built without -race, for timing
// requirements (the race detector slows start-up, RSA key generation above
// all, several-fold).
func plainBrokerBinary(t testing.TB) string {
	t.Helper()
	return suite.plain.get(t, false)
}

// devBinary returns gpubroker-dev built without -race: what `go tool task
// dev` runs (E2E_GPUBROKER_DEV_BIN: a prebuilt one).
func devBinary(t testing.TB) string {
	t.Helper()
	return suite.dev.get(t, false)
}

// agentBinary returns gpubroker-agent built without -race
// (E2E_GPUBROKER_AGENT_BIN: a prebuilt one).
func agentBinary(t testing.TB) string {
	t.Helper()
	return suite.agent.get(t, false)
}

// binary is one build of a command, made at most once.
type binary struct {
	pkg, env string // the command (default gpubroker) and the variable naming a prebuilt one (default E2E_GPUBROKER_BIN)
	dir      string // the commands' folder; default ./broker/cmd/
	once     sync.Once
	path     string
	err      error
}

// get builds the binary on first use into the suite's dir, or takes the
// prebuilt one its variable names, and fails t if that failed.
func (b *binary) get(t testing.TB, race bool) string {
	t.Helper()
	b.once.Do(func() {
		pkg, env := b.pkg, b.env
		if pkg == "" {
			pkg, env = "gpubroker", "E2E_GPUBROKER_BIN"
		}
		if bin := os.Getenv(env); bin != "" {
			b.path, b.err = filepath.Abs(bin)
			return
		}
		out := filepath.Join(suite.dir, pkg)
		args := []string{"build", "-o"}
		if race {
			out += "-race"
			args = append(args, out, "-race")
		} else {
			args = append(args, out)
		}
		dir := b.dir
		if dir == "" {
			dir = "./broker/cmd/"
		}
		args = append(args, dir+pkg)
		cmd := exec.Command("go", args...)
		cmd.Dir = ".." // the module root
		start := time.Now()
		if outb, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, outb)
			return
		}
		fmt.Fprintf(os.Stderr, "e2e: built %s in %s\n", filepath.Base(out), time.Since(start).Round(time.Millisecond))
		b.path = out
	})
	if b.err != nil {
		t.Fatalf("e2e: gpubroker binary: %v", b.err)
	}
	return b.path
}
