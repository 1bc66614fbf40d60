package cliconfig_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpubroker/gpubroker/limiter/cliconfig"
)

func TestKubeFlagsSetTheClientsRateLimit(t *testing.T) {
	kc := writeFile(t, "kubeconfig", `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://api.example:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`)
	var k cliconfig.Kube
	tab := &cliconfig.Table{Program: "t", EnvPrefix: "T_", Flags: k.Flags(cliconfig.KubeDefaults{QPS: 50, Burst: 100, Source: "the scheduler's"})}
	if _, err := tab.Load([]string{"--kubeconfig=" + kc, "--kube-api-burst=7"}, []string{"T_KUBE_API_QPS=12.5"}); err != nil {
		t.Fatal(err)
	}
	rc, err := k.RESTConfig("ua/1")
	if err != nil {
		t.Fatal(err)
	}
	if rc.QPS != 12.5 || rc.Burst != 7 || rc.UserAgent != "ua/1" || rc.Host != "https://api.example:6443" || k.Where() != rc.Host {
		t.Errorf("rest config QPS %g burst %d agent %q host %q, where %q", rc.QPS, rc.Burst, rc.UserAgent, rc.Host, k.Where())
	}
	if rc.ContentType != "application/vnd.kubernetes.protobuf" || rc.AcceptContentTypes != "application/vnd.kubernetes.protobuf,application/json" {
		t.Errorf("content type %q, accepts %q; want protobuf, JSON as the fallback", rc.ContentType, rc.AcceptContentTypes)
	}
	_, err = tab.Load([]string{"--kube-api-qps=0", "--kube-api-burst=0"}, nil)
	want := "--kube-api-qps (T_KUBE_API_QPS): must be > 0, got 0\n--kube-api-burst (T_KUBE_API_BURST): must be at least 1, got 0"
	if err == nil || err.Error() != want {
		t.Errorf("zero limits: %v, want\n%s", err, want)
	}
	if !strings.Contains(tab.Usage(), "env T_KUBE_API_QPS, default \"50\"") {
		t.Errorf("usage:\n%s", tab.Usage())
	}
}

// The client asks the API server for no gzip, on requests and on watches.
// The server speaks TLS, as an API server does: over plain HTTP client-go
// uses http.DefaultTransport, which ignores DisableCompression.
func TestKubeClientAsksForNoCompression(t *testing.T) {
	var mu sync.Mutex
	var seen []string // "METHOD path: Accept-Encoding"
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Method+" "+r.URL.Path+": "+r.Header.Get("Accept-Encoding"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Query().Get("watch") == "true" {
			return // an empty watch: the stream ends at once
		}
		_, _ = io.WriteString(w, `{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[]}`)
	}))
	t.Cleanup(srv.Close)
	kc := writeFile(t, "kubeconfig", `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "`+srv.URL+`", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`)
	k := cliconfig.Kube{Kubeconfig: kc, QPS: 50, Burst: 100}
	cs, err := k.Clientset("ua/1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Pods("ns").List(t.Context(), metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	w, err := cs.CoreV1().Pods("ns").Watch(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for range w.ResultChan() {
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 2 {
		t.Fatalf("requests %q, want a list and a watch", seen)
	}
	for _, s := range seen {
		if !strings.HasSuffix(s, ": ") {
			t.Errorf("%s: want no Accept-Encoding", s)
		}
	}
}
