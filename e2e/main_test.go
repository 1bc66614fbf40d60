// Package e2e holds gpubroker's end-to-end tests: a real etcd, kube-apiserver
// and kwok shared by the whole `go test` process, and for each test its own
// namespace, kwok nodes, redis-server, OIDC issuer and gpubroker process.
// The tests use only public interfaces: the gpubroker binary, its REST API
// (broker/api/v1), client-go, and the public test helpers broker/redistest and
// broker/devissuer.
//
// The tools come from `go tool task e2e:tools` (e2e/.bin). Without them, or
// without redis-server, the tests skip, unless CI=true, where they fail.
// `go test -short` skips them too. E2E_GPUBROKER_BIN=<path> tests a prebuilt
// gpubroker binary instead of building ./broker/cmd/gpubroker.
package e2e

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gpubroker/gpubroker/e2e/harness"
)

// suite is the state TestMain sets up once for all tests; read-only while
// tests run (the broker build is guarded by its own sync.Once).
var suite struct {
	skipReason string // set: tools are missing or -short
	startErr   error  // set: the cluster failed to start
	cluster    *harness.Cluster
	tools      harness.Tools
	dir        string

	brokerOnce sync.Once
	brokerBin  string
	brokerErr  error
}

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	flag.Parse()
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
		suite.skipReason = err.Error()
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
		}
		if err := suite.cluster.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: stop cluster: %s\n", err)
			code = 1
		}
	}
	if code == 0 {
		_ = os.RemoveAll(dir)
	} else {
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

// needCluster returns the shared cluster, or skips t when the tools are
// missing (fails it instead when CI=true) and fails it when the cluster did
// not start.
func needCluster(t *testing.T) *harness.Cluster {
	t.Helper()
	if suite.skipReason != "" {
		if os.Getenv("CI") == "true" && !testing.Short() {
			t.Fatalf("e2e: %s", suite.skipReason)
		}
		t.Skipf("e2e: %s", suite.skipReason)
	}
	if suite.startErr != nil {
		t.Fatalf("e2e: cluster did not start: %v", suite.startErr)
	}
	return suite.cluster
}

// brokerBinary builds ./broker/cmd/gpubroker once per test process (with
// -race when this test binary has it) and returns its path. The environment
// variable E2E_GPUBROKER_BIN names a prebuilt binary to test instead.
func brokerBinary(t *testing.T) string {
	t.Helper()
	suite.brokerOnce.Do(func() {
		if bin := os.Getenv("E2E_GPUBROKER_BIN"); bin != "" {
			suite.brokerBin, suite.brokerErr = filepath.Abs(bin)
			return
		}
		out := filepath.Join(suite.dir, "gpubroker")
		args := []string{"build", "-o", out}
		if raceEnabled {
			args = append(args, "-race")
		}
		args = append(args, "./broker/cmd/gpubroker")
		cmd := exec.Command("go", args...)
		cmd.Dir = ".." // the module root
		start := time.Now()
		if b, err := cmd.CombinedOutput(); err != nil {
			suite.brokerErr = fmt.Errorf("go %v: %w\n%s", args, err, b)
			return
		}
		fmt.Fprintf(os.Stderr, "e2e: built gpubroker in %s\n", time.Since(start).Round(time.Millisecond))
		suite.brokerBin = out
	})
	if suite.brokerErr != nil {
		t.Fatalf("e2e: build gpubroker: %v", suite.brokerErr)
	}
	return suite.brokerBin
}
