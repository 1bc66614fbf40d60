package e2e

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/gpubroker/gpubroker/spawner"
)

// traceMax is how many log lines traceLost prints per lost server.
const traceMax = 60

// traceLost prints, for each server the soak's end check found lost
// ("lost: <user>/<name> …" in end), every line of the replicas' whole logs
// that names it or its pod, but for reads (GET): the creates, stops,
// restores, pod events and deletes that led to the loss, so a failure can
// be read without the logs (E2E_ARTIFACTS keeps them whole).
func traceLost(t *testing.T, logs []string, end []string) {
	for _, p := range end {
		rest, ok := strings.CutPrefix(p, "lost: ")
		if !ok {
			continue
		}
		key, _, _ := strings.Cut(rest, " ")
		user, name, ok := strings.Cut(key, "/")
		if !ok {
			continue
		}
		lines, err := lostTrace(logs, user, name)
		if err != nil {
			t.Logf("trace %s: %v", key, err)
		}
		if len(lines) > traceMax {
			lines = append(lines[:traceMax/2:traceMax/2], append([]string{"…"}, lines[len(lines)-traceMax/2:]...)...)
		}
		t.Logf("trace of lost %s (pod %s), %d log lines:\n%s", key, spawner.PodName(user, name), len(lines), strings.Join(lines, "\n"))
	}
}

// lostTrace returns the lines of the logs that name server user/name or
// its pod, but for reads (GET), each prefixed with its replica's index.
func lostTrace(logs []string, user, name string) ([]string, error) {
	pod := spawner.PodName(user, name)
	userField := `"user":"` + user + `"`
	var lines []string
	for i, path := range logs {
		f, err := os.Open(path) // #nosec G304 -- the test's own broker logs
		if err != nil {
			return lines, err
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
		for sc.Scan() {
			l := sc.Text()
			mine := strings.Contains(l, pod) ||
				(strings.Contains(l, userField) && (strings.Contains(l, `"server":"`+name+`"`) ||
					strings.Contains(l, "/servers/"+name+`"`) || strings.Contains(l, "/servers/"+name+"/")))
			if mine && !strings.Contains(l, `"method":"GET"`) {
				lines = append(lines, "replica "+strconv.Itoa(i)+": "+l)
			}
		}
		err = sc.Err()
		_ = f.Close()
		if err != nil {
			return lines, err
		}
	}
	return lines, nil
}

func TestLostTracePicksTheServersLines(t *testing.T) {
	dir := t.TempDir()
	a, b := dir+"/0.log", dir+"/1.log"
	write := func(path string, lines ...string) {
		if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(a,
		`{"msg":"request","user":"u1","method":"PUT","path":"/api/v1/users/u1/servers/nb1","status":201}`,
		`{"msg":"request","user":"u1","method":"GET","path":"/api/v1/users/u1/servers/nb1","status":200}`,
		`{"msg":"request","user":"u1","method":"PUT","path":"/api/v1/users/u1/servers/nb10","status":201}`,
		`{"msg":"request","user":"u10","method":"PUT","path":"/api/v1/users/u10/servers/nb1","status":201}`)
	write(b,
		`{"msg":"deleted","kind":"pod","name":"`+spawner.PodName("u1", "nb1")+`"}`,
		`{"msg":"resize","user":"u1","method":"PATCH","path":"/api/v1/users/u1/servers/nb1/slice"}`)
	got, err := lostTrace([]string{a, b}, "u1", "nb1")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || !strings.HasPrefix(got[0], "replica 0: ") || !strings.Contains(got[0], `"PUT"`) ||
		!strings.HasPrefix(got[1], "replica 1: ") || !strings.Contains(got[2], "/slice") {
		t.Errorf("trace = %q, want u1/nb1's PUT, its pod's delete and its resize, no GET, no nb10, no u10", got)
	}
}
