package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/jupytertest"
	"github.com/gpubroker/gpubroker/e2e/harness"
	"github.com/gpubroker/gpubroker/spawner"
	"github.com/gpubroker/gpubroker/spawner/runner"
)

// notebookToken reads the notebook token of a server's current spawn from
// its Secret, as only the broker should.
func (e *env) notebookToken(ctx context.Context, user, name string) string {
	e.t.Helper()
	sec, err := e.cluster.Client.CoreV1().Secrets(e.ns).Get(ctx, spawner.SecretName(user, name), metav1.GetOptions{})
	if err != nil {
		e.t.Fatalf("the server's Secret: %v", err)
	}
	tok := string(sec.Data[v1.EnvNotebookToken])
	if len(tok) < 20 {
		e.t.Fatalf("the server's Secret holds no notebook token (%q)", tok)
	}
	return tok
}

// startNotebook creates user's server name with profile and waits until it
// runs.
func (e *env) startNotebook(ctx context.Context, user, name, profile string) v1.Server {
	e.t.Helper()
	cl := e.client(user, "ml")
	if _, _, err := cl.CreateServer(ctx, user, name, "k-"+name, v1.CreateServerRequest{Profile: profile}); err != nil {
		e.t.Fatalf("create %s/%s: %v", user, name, err)
	}
	s, err := cl.WaitServer(ctx, user, name, v1.StateRunning, 90*time.Second)
	if err != nil {
		e.t.Fatalf("%v\n--- the notebook's output:\n%s", err, e.runner.Log(e.ns, spawner.PodName(user, name), 30))
	}
	return s
}

// seenBody is one answer of the proxy, kept to look for the token in it.
type seenBody struct {
	what, text string
}

// call sends a request through the broker's proxy and returns the status
// and the whole answer (status line, headers, body) as text.
func call(ctx context.Context, t *testing.T, method, url string, header http.Header) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header = header
	hc := &http.Client{Timeout: 30 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	defer hc.CloseIdleConnections()
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var all strings.Builder
	fmt.Fprintf(&all, "%s\n", resp.Status)
	_ = resp.Header.Write(&all)
	all.Write(b)
	return resp.StatusCode, all.String(), resp.Header
}

// TestNotebookThroughTheProxy runs a real Jupyter notebook in a pod of the
// pod runner and reaches it through the broker (path mode) with bearer
// tokens: the owner's reaches its API and runs a cell over the kernel
// WebSocket; another user's token, no credentials, a stopped server and an
// unknown server each get their answer; the notebook's token is in the
// server's Secret only, never in the pod's plain env nor in any answer.
func TestNotebookThroughTheProxy(t *testing.T) {
	t.Parallel()
	e := newBrowserEnvWith(t, browserOptions{notebooks: true})
	ctx := t.Context()
	s := e.startNotebook(ctx, "alice", "nb", "jupyter")
	if want := e.public + "/user/alice/nb/"; s.OpenURL != want {
		t.Fatalf("openUrl %q, want %q", s.OpenURL, want)
	}
	token := e.notebookToken(ctx, "alice", "nb")
	pod, err := e.cluster.Client.CoreV1().Pods(e.ns).Get(ctx, s.Pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range pod.Spec.Containers[0].Env {
		if strings.Contains(ev.Value, token) || ev.Name == v1.EnvNotebookToken {
			t.Errorf("the pod's plain env %s carries the notebook token", ev.Name)
		}
	}

	// A stopped server of alice's, for its answer.
	e.startNotebook(ctx, "alice", "old", "jupyter")
	if _, err := e.client("alice", "ml").DeleteServer(ctx, "alice", "old"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client("alice", "ml").WaitServer(ctx, "alice", "old", v1.StateStopped, 60*time.Second); err != nil {
		t.Fatal(err)
	}

	bearer := func(user string) http.Header {
		return http.Header{"Authorization": {"Bearer " + e.token(user, "ml")}}
	}
	html := http.Header{"Accept": {"text/html"}}
	var answers []seenBody
	tests := []struct {
		name   string
		path   string
		header http.Header
		status int
		want   string
	}{
		{"the owner's token reaches the notebook's own API", "/user/alice/nb/api/kernels", bearer("alice"), 200, "[]"},
		{"another user's token gets 404", "/user/alice/nb/api/kernels", bearer("bob"), 404, "not_found"},
		{"no credentials, a script: 401", "/user/alice/nb/api/kernels", http.Header{}, 401, "unauthenticated"},
		{"no credentials, a browser: the sign-in, coming back", "/user/alice/nb/tree", html, 303, "/auth/login?next=%2Fuser%2Falice%2Fnb%2Ftree"},
		{"an unknown server: 404", "/user/alice/nope/api/kernels", bearer("alice"), 404, "not_found"},
		{"a stopped server, a script: 503", "/user/alice/old/api/kernels", bearer("alice"), 503, "not_running"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, all, _ := call(ctx, t, http.MethodGet, e.public+tc.path, tc.header)
			answers = append(answers, seenBody{tc.name, all})
			if status != tc.status || !strings.Contains(all, tc.want) {
				t.Errorf("%d, want %d with %q:\n%.600s", status, tc.status, tc.want, all)
			}
		})
	}

	nb := jupytertest.Client{Base: s.OpenURL, Header: bearer("alice"), Origin: e.public}
	cctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	id, err := nb.StartKernel(cctx)
	if err != nil {
		t.Fatalf("start a kernel through the proxy: %v", err)
	}
	out, err := nb.Execute(cctx, id, "print(6*7)", true)
	if err != nil || strings.TrimSpace(out) != "42" {
		t.Fatalf("print(6*7) over the kernel WebSocket through the proxy: %q, %v", out, err)
	}
	// The kernel, a child of the notebook server, runs in the pod's slice
	// under the real hook: the library is loaded, and the quota the agent's
	// code wrote sits at the fixed path on a read-only mount.
	probe := fmt.Sprintf("import os; print('libgpulimit.so' in open('/proc/self/maps').read(), os.path.isfile(%q), "+
		"os.statvfs(%q).f_flag & os.ST_RDONLY != 0)", v1.PodQuotaDir+"/"+v1.QuotaFileName, v1.PodQuotaDir)
	if out, err := nb.Execute(cctx, id, probe, true); err != nil || strings.TrimSpace(out) != "True True True" {
		t.Errorf("the kernel under the hook (loaded, quota file present, read-only mount): %q, %v; want True True True", out, err)
	}
	foreign := jupytertest.Client{Base: s.OpenURL, Header: bearer("alice"), Origin: "http://evil.example"}
	if _, err := foreign.Execute(cctx, id, "print(1)", true); err == nil {
		t.Error("a kernel WebSocket opened from another origin was let through")
	}
	for _, a := range answers {
		if strings.Contains(a.text, token) {
			t.Errorf("%s: the answer carries the notebook token", a.what)
		}
	}
}

// TestPodRunnerFailures checks the fail-fast paths on real processes: a
// notebook command that exits with an error fails the spawn with the
// program's own words; a notebook killed once is restarted in place and the
// server stays; killed again at once it crash-loops and the server stops
// with the reason; a pod deleted behind the broker's back stops the server,
// frees its slice and ends its process.
func TestPodRunnerFailures(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{notebooks: true})
	ctx := t.Context()
	alice := e.client("alice", "ml")

	t.Run("a failing command fails the spawn with its message", func(t *testing.T) {
		if _, _, err := alice.CreateServer(ctx, "alice", "crash", "k-crash", v1.CreateServerRequest{Profile: "crashing"}); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		s, err := alice.WaitServer(ctx, "alice", "crash", v1.StateFailed, 60*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("failed after %s: %s", time.Since(start).Round(time.Millisecond), s.Message)
		for _, want := range []string{"exited with code 3", "permission denied"} {
			if !strings.Contains(s.Message, want) {
				t.Errorf("failure %q lacks %q", s.Message, want)
			}
		}
	})

	s := e.startNotebook(ctx, "alice", "nb", "jupyter")
	kill := func() {
		t.Helper()
		err := harness.Poll(ctx, 50*time.Millisecond, 60*time.Second, func(context.Context) (bool, string, error) {
			err := e.runner.Signal(e.ns, s.Pod, syscall.SIGKILL)
			return err == nil, fmt.Sprint(err), nil
		})
		if err != nil {
			t.Fatalf("kill the notebook: %v", err)
		}
	}
	t.Run("killed once: restarted in place", func(t *testing.T) {
		kill()
		err := harness.Poll(ctx, 100*time.Millisecond, 60*time.Second, func(ctx context.Context) (bool, string, error) {
			pod, err := e.cluster.Client.CoreV1().Pods(e.ns).Get(ctx, s.Pod, metav1.GetOptions{})
			if err != nil {
				return false, err.Error(), nil
			}
			cs := pod.Status.ContainerStatuses
			ready := len(cs) == 1 && cs[0].Ready && cs[0].RestartCount == 1
			return ready, fmt.Sprintf("%+v", cs), nil
		})
		if err != nil {
			t.Fatalf("the notebook was not restarted: %v", err)
		}
		got, err := alice.GetServer(ctx, "alice", "nb")
		if err != nil || got.State != v1.StateRunning || got.SpawnID != s.SpawnID {
			t.Errorf("after one crash: %+v %v, want the same spawn running", got, err)
		}
	})
	t.Run("killed again at once: the server stops with the reason", func(t *testing.T) {
		kill()
		got, err := alice.WaitServer(ctx, "alice", "nb", v1.StateStopped, 60*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(got.Message, "killed by signal 9") {
			t.Errorf("stop reason %q does not say the notebook was killed", got.Message)
		}
		e.waitNoAllocations(t, ctx)
	})
	t.Run("a vanished pod stops the server and its process", func(t *testing.T) {
		v := e.startNotebook(ctx, "alice", "vanish", "jupyter")
		zero := int64(0)
		if err := e.cluster.Client.CoreV1().Pods(e.ns).Delete(ctx, v.Pod, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			t.Fatal(err)
		}
		if _, err := alice.WaitServer(ctx, "alice", "vanish", v1.StateStopped, 60*time.Second); err != nil {
			t.Fatal(err)
		}
		e.waitNoAllocations(t, ctx)
		err := harness.Poll(ctx, 50*time.Millisecond, 30*time.Second, func(context.Context) (bool, string, error) {
			err := e.runner.Signal(e.ns, v.Pod, syscall.Signal(0))
			return errors.Is(err, runner.ErrNoProcess), fmt.Sprint(err), nil
		})
		if err != nil {
			t.Errorf("the vanished pod's process lives on: %v", err)
		}
	})
}

// waitNoAllocations waits until no slice is allocated.
func (e *env) waitNoAllocations(t *testing.T, ctx context.Context) {
	t.Helper()
	err := harness.Poll(ctx, 100*time.Millisecond, 30*time.Second, func(context.Context) (bool, string, error) {
		use := e.allocated(t)
		return len(use) == 0, fmt.Sprintf("%+v", use), nil
	})
	if err != nil {
		t.Errorf("slices still allocated: %v", err)
	}
}
