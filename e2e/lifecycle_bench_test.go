package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/e2e/harness"
)

// lifecycleRounds is how many server lifecycles one benchmark iteration
// runs one after the other.
const lifecycleRounds = 20

// BenchmarkLifecycleAPIRequests counts the pod requests the API server
// serves per server lifecycle (create, running, stop, the pod gone), by
// verb, from the API server's own apiserver_request_total: the broker's
// and kwok's (the kubelet's part) together, the test's own reads left out
// (it only waits on the broker's API and reads pods once the server is
// stopped, which it counts and subtracts). Run it alone (-run '^$'): other
// tests share the API server. Compare binaries with E2E_GPUBROKER_BIN.
func BenchmarkLifecycleAPIRequests(b *testing.B) {
	e := newEnv(b, envOptions{})
	ctx := b.Context()
	c := e.client("erin")
	pods := e.cluster.Client.CoreV1().Pods(e.ns)
	b.ResetTimer()
	for iter := range b.N {
		before, err := podRequests(ctx, e)
		if err != nil {
			b.Fatal(err)
		}
		own := 0 // the test's own pod reads
		for i := range lifecycleRounds {
			name := fmt.Sprintf("nb%d-%d", iter, i)
			if _, _, err := c.CreateServer(ctx, "erin", name, "k-"+name, v1.CreateServerRequest{Profile: "small"}); err != nil {
				b.Fatalf("create: %v", err)
			}
			s, err := c.WaitServer(ctx, "erin", name, v1.StateRunning, time.Minute)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := c.DeleteServer(ctx, "erin", name); err != nil {
				b.Fatalf("delete: %v", err)
			}
			if _, err := c.WaitServer(ctx, "erin", name, v1.StateStopped, time.Minute); err != nil {
				b.Fatal(err)
			}
			err = harness.Poll(ctx, 50*time.Millisecond, time.Minute, func(ctx context.Context) (bool, string, error) {
				own++
				_, err := pods.Get(ctx, s.Pod, metav1.GetOptions{})
				return apierrors.IsNotFound(err), fmt.Sprintf("pod %s: %v", s.Pod, err), nil
			})
			if err != nil {
				b.Fatal(err)
			}
		}
		after, err := podRequests(ctx, e)
		if err != nil {
			b.Fatal(err)
		}
		after["GET"] -= float64(own)
		var parts []string
		total := 0.0
		for _, verb := range slices.Sorted(func(yield func(string) bool) {
			for v := range after {
				if !yield(v) {
					return
				}
			}
		}) {
			n := (after[verb] - before[verb]) / lifecycleRounds
			if n == 0 {
				continue
			}
			total += n
			parts = append(parts, fmt.Sprintf("%s %.2f", verb, n))
			b.ReportMetric(n, strings.ToLower(verb)+"/lifecycle")
		}
		b.ReportMetric(total, "pod-requests/lifecycle")
		b.Logf("pod requests per lifecycle (%d lifecycles): %.2f: %s", lifecycleRounds, total, strings.Join(parts, ", "))
	}
}

// requestLine matches the pod lines of apiserver_request_total, without
// subresource (status writes are the kubelet's) as well as with.
var requestLine = regexp.MustCompile(`^apiserver_request_total\{([^}]*)\} ([0-9.e+]+)$`)

// podRequests returns the API server's apiserver_request_total for core
// pods (any subresource), summed by verb.
func podRequests(ctx context.Context, e *env) (map[string]float64, error) {
	raw, err := e.cluster.Client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("API server metrics: %w", err)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := requestLine.FindStringSubmatch(sc.Text())
		if m == nil || !strings.Contains(m[1], `resource="pods"`) || !strings.Contains(m[1], `group=""`) {
			continue
		}
		verb := ""
		for _, kv := range strings.Split(m[1], ",") {
			if v, ok := strings.CutPrefix(kv, `verb="`); ok {
				verb = strings.TrimSuffix(v, `"`)
			}
		}
		n, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			return nil, fmt.Errorf("API server metrics: %q: %w", sc.Text(), err)
		}
		out[verb] += n
	}
	return out, sc.Err()
}
