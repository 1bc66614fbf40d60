package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpubroker/gpubroker/broker/devissuer"
	"github.com/gpubroker/gpubroker/broker/redistest"
	"github.com/gpubroker/gpubroker/limiter/cliconfig/cliconfigtest"
)

func TestDevPointsToItsOwnBinary(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"dev", "--dev-gpus=2"}, nil, &stdout, &stderr); code != 2 {
		t.Errorf("gpubroker dev: exit %d, want 2", code)
	}
	if !strings.Contains(stderr.String(), "gpubroker-dev") || !strings.Contains(stderr.String(), "go tool task dev") {
		t.Errorf("gpubroker dev does not point to gpubroker-dev and go tool task dev:\n%s", stderr.String())
	}
}

func TestServeHelpListsOnlyWhatServeReads(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"serve", "--help"}, nil, &stdout, &stderr); code != 0 {
		t.Fatalf("serve --help: exit %d\n%s", code, stderr.String())
	}
	help := stdout.String()
	if !strings.Contains(help, "  --redis-url URL\n") || strings.Contains(help, "dev-gpus") || strings.Contains(help, "dev mode") {
		t.Errorf("serve --help lists dev mode's settings or lacks serve's:\n%s", help)
	}
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestCheckConfigTellsTheWholeTruthAtOnce gives gpubroker serve
// --check-config problems of every kind in one run: unknown and misspelled
// flags, values that do not parse in flags and in variables, a missing
// required setting, a file that does not exist, a profiles file with
// several problems, a misspelled variable, and a bad variable that a good
// flag overrides. Every problem is printed, once, in the user's terms; the
// overridden variable is not.
func TestCheckConfigTellsTheWholeTruthAtOnce(t *testing.T) {
	profiles := writeFile(t, "profiles.yaml", "profiles:\n  - name: Big\n    displayName: \"\"\n    image: \"a b\"\n    cpu: \"1\"\n    memory: 1Gi\n    slice: {memoryMiB: 1, computePercent: 1, computeLimitPercent: 1}\n")
	missing := filepath.Join(t.TempDir(), "missing")
	var stdout, stderr bytes.Buffer
	code := run([]string{"serve", "--check-config", "--nope", "--redis-ulr=redis://r", "--start-timeout=5",
		"--profiles-file=" + profiles, "--hub-token-file=" + missing, "--kubeconfig=" + cliconfigtest.DeadKubeconfig(t), "--shutdown-timeout=1s",
		"--oidc-issuer=https://idp.example"},
		[]string{"GPUBROKER_ORPHAN_GRACE=soon", "GPUBROKER_CHECK_CONFIG=perhaps", "GPUBROKER_SHUTDOWN_TIMEOUT=never",
			"GPUBROKER_REDIS_URL=redis://127.0.0.1:6390/0", "GPUBROKER_NAMESPCE=x"},
		&stdout, &stderr)
	if code != 2 {
		t.Errorf("exit %d, want 2", code)
	}
	out := stderr.String()
	for _, want := range []string{
		"gpubroker serve: warning: GPUBROKER_NAMESPCE is set, but gpubroker serve has no such setting; did you mean GPUBROKER_NAMESPACE?\n",
		"gpubroker serve: invalid configuration:\n",
		"  - --nope: no such flag (see gpubroker serve --help)\n",
		"  - --redis-ulr: no such flag; did you mean --redis-url? (see gpubroker serve --help)\n",
		"  - --start-timeout \"5\" is not a duration such as 30s, 2m or 1h\n",
		"  - GPUBROKER_ORPHAN_GRACE=\"soon\" is not a duration such as 30s, 2m or 1h (for --orphan-grace)\n",
		"  - --oidc-audience (GPUBROKER_OIDC_AUDIENCE): is required in serve mode and whenever --oidc-issuer is set\n",
		"  - --hub-token-file (GPUBROKER_HUB_TOKEN_FILE): cannot use " + missing,
		"  - --profiles-file (GPUBROKER_PROFILES_FILE) " + profiles + ": profiles[0] (Big): name \"Big\" must be a DNS-1123 label",
		"  - --profiles-file (GPUBROKER_PROFILES_FILE) " + profiles + ": profiles[0] (Big): displayName is empty\n",
		"  - --profiles-file (GPUBROKER_PROFILES_FILE) " + profiles + ": profiles[0] (Big): image \"a b\" contains whitespace\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	// --check-config's bad variable is overridden by the flag; so is
	// --shutdown-timeout's: neither is reported. The dead API server is
	// not contacted without --connect.
	for _, not := range []string{"GPUBROKER_CHECK_CONFIG", "GPUBROKER_SHUTDOWN_TIMEOUT", "shutdown-timeout", "127.0.0.1:1", "-start-timeout\""} {
		if strings.Contains(out, not) {
			t.Errorf("output mentions %q:\n%s", not, out)
		}
	}
	if n := strings.Count(out, "  - "); n != 9 {
		t.Errorf("%d problems printed, want 9 (one per problem):\n%s", n, out)
	}
	if stdout.Len() != 0 {
		t.Errorf("stdout: %q", stdout.String())
	}
}

// TestConnectNamesEachDependencyAndWhetherItAnswers runs --connect against
// a real redis-server and OIDC issuer and an API server that is not there.
func TestConnectNamesEachDependencyAndWhetherItAnswers(t *testing.T) {
	redis := redistest.Start(t)
	issuer := devissuer.StartTest(t)
	profiles := writeFile(t, "profiles.yaml", "profiles:\n  - {name: small, displayName: Small, image: i, cpu: \"1\", memory: 1Gi, slice: {memoryMiB: 1024, computePercent: 10, computeLimitPercent: 50}}\n")
	var stdout, stderr bytes.Buffer
	code := run([]string{"serve", "--connect", "--redis-url=" + redis.URL(), "--oidc-issuer=" + issuer.URL(), "--oidc-audience=gpubroker",
		"--profiles-file=" + profiles, "--kubeconfig=" + cliconfigtest.DeadKubeconfig(t)}, nil, &stdout, &stderr)
	if code != 1 {
		t.Errorf("exit %d, want 1 (the API server does not answer)\n%s", code, stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{
		"gpubroker serve: configuration is valid\n",
		"connect: redis      ok      " + redis.URL() + " answered in ",
		"connect: oidc       ok      " + issuer.URL() + " answered in ",
		"connect: kubernetes FAILED  https://127.0.0.1:1, namespace gpubroker-notebooks: list pods: ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(stderr.String(), "gpubroker serve: 1 of 3 dependencies do not answer (see above)") {
		t.Errorf("stderr: %s", stderr.String())
	}
}

func TestVersionPrintsBuildInformation(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}, {"serve", "--version"}} {
		var stdout, stderr bytes.Buffer
		if code := run(args, nil, &stdout, &stderr); code != 0 {
			t.Errorf("%v: exit %d", args, code)
		}
		if out := stdout.String(); !strings.HasPrefix(out, "gpubroker ") || !strings.Contains(out, "\n  go        go1.") || !strings.Contains(out, "\n  platform  ") {
			t.Errorf("%v prints %q", args, out)
		}
	}
}
