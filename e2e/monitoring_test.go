package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/e2e/harness"
	"github.com/gpubroker/gpubroker/e2e/testdeps"
	"github.com/gpubroker/gpubroker/limiter/hook/stubtest"
)

// The monitoring files the chart ships, relative to this package.
const (
	dashboardFile = "../deploy/helm/gpubroker/dashboards/gpubroker.json"
	rulesFile     = "../deploy/helm/gpubroker/rules/gpubroker.rules.yaml"
	rulesTestFile = "testdata/gpubroker.rules.test.yaml"
)

// TestAlertRulesPassPromtool runs Debian's promtool over the alert rules:
// `check rules` (syntax, PromQL, templates) and `test rules` (the cases in
// testdata/gpubroker.rules.test.yaml: each alert fires on the series that
// should raise it and stays silent on a healthy fleet).
func TestAlertRulesPassPromtool(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("promtool does not run with -short")
	}
	promtool := testdeps.Need(t, "/usr/bin/promtool")
	for _, args := range [][]string{{"check", "rules", rulesFile}, {"test", "rules", rulesTestFile}} {
		out, err := exec.CommandContext(t.Context(), promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		} else {
			t.Logf("promtool %s: %s", strings.Join(args, " "), strings.TrimSpace(string(out)))
		}
	}
}

// TestEveryDashboardAndAlertQueryHasSeries runs a real Prometheus (Debian's)
// scraping a broker's --metrics-listen and a node agent (the real binary on
// the stub NVML driver, on one of the env's kwok nodes) with the alert rules
// loaded, runs servers on the agent's GPU, and checks through Prometheus's
// HTTP API that every expression of the dashboard, and every alert
// expression with its comparisons made `bool` (so that a healthy fleet
// still has series), returns series; and that Prometheus evaluates every
// rule without error.
func TestEveryDashboardAndAlertQueryHasSeries(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{nodes: 2})
	ctx := t.Context()
	node := e.nodes[1]
	uuid := stubUUID()
	agentMetrics := startAgent(t, e, node, uuid)

	// The env's own GPUs take no slices, so the servers go to the agent's.
	for _, g := range e.gpus {
		g.Healthy = false
		if err := e.admin.PutGPU(ctx, g); err != nil {
			t.Fatalf("mark %s unhealthy: %v", g.UUID, err)
		}
	}
	err := harness.Poll(ctx, 100*time.Millisecond, 30*time.Second, func(ctx context.Context) (bool, string, error) {
		gpus, err := e.admin.GPUs(ctx)
		if err != nil {
			return false, err.Error(), nil
		}
		for _, g := range gpus {
			if g.UUID == uuid && g.Healthy && g.Node == node {
				return true, "", nil
			}
		}
		return false, fmt.Sprintf("GPUs %+v", gpus), nil
	})
	if err != nil {
		t.Fatalf("the agent's GPU was not registered: %v", err)
	}
	for _, u := range []string{"ann", "ben"} {
		cl := e.client(u)
		if _, _, err := cl.CreateServer(ctx, u, "nb", "", v1.CreateServerRequest{Profile: "small"}); err != nil {
			t.Fatalf("create %s/nb: %v", u, err)
		}
		if s, err := cl.WaitServer(ctx, u, "nb", v1.StateRunning, 60*time.Second); err != nil || s.GPU == nil || s.GPU.UUID != uuid {
			t.Fatalf("%s/nb: %+v, %v; want running on %s", u, s, err, uuid)
		}
	}

	prom := startPrometheus(t, map[string]string{
		"gpubroker":       strings.TrimPrefix(e.broker.MetricsURL, "http://"),
		"gpubroker-agent": strings.TrimPrefix(agentMetrics, "http://"),
	})
	// Keep API traffic flowing, so request rates have samples.
	tctx, stop := context.WithCancel(ctx)
	var traffic sync.WaitGroup
	traffic.Go(func() {
		cl := e.client("ann")
		for tctx.Err() == nil {
			_, _ = cl.GetServer(tctx, "ann", "nb")
			select {
			case <-tctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	})
	defer func() { stop(); traffic.Wait() }()

	queries := dashboardQueries(t)
	for _, r := range alertRules(t) {
		queries = append(queries, query{from: "alert " + r.name, expr: boolComparisons(r.expr)})
	}
	var missing []string
	last := "no query answered yet"
	start := time.Now()
	err = harness.Poll(ctx, time.Second, 90*time.Second, func(ctx context.Context) (bool, string, error) {
		missing = missing[:0]
		for _, q := range queries {
			n, err := prom.count(ctx, q.expr)
			if err != nil {
				if ctx.Err() != nil {
					return false, last, nil // the deadline: the round before says what was missing
				}
				missing = append(missing, fmt.Sprintf("%s: %s: %v", q.from, q.expr, err))
				continue
			}
			if n == 0 {
				missing = append(missing, q.from+": "+q.expr)
			}
		}
		last = fmt.Sprintf("%d of %d queries without series: %s", len(missing), len(queries), strings.Join(missing, " | "))
		return len(missing) == 0, last, nil
	})
	if err != nil {
		t.Fatalf("queries without series for a running fleet: %v", err)
	}
	t.Logf("all %d dashboard and alert queries have series, %s after Prometheus started", len(queries), time.Since(start).Round(time.Second))

	// Prometheus loaded every rule and evaluates it without error.
	rules, err := prom.rules(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rules) != len(alertRules(t)) {
		t.Errorf("Prometheus has %d rules, the rules file %d", len(rules), len(alertRules(t)))
	}
	for name, health := range rules {
		if health != "ok" && health != "unknown" {
			t.Errorf("rule %s: health %q", name, health)
		}
	}
}

// startAgent runs gpubroker-agent on node on the stub NVML driver (one GPU
// with uuid), on the env's Redis and the cluster, and returns its metrics
// base URL once /healthz answers.
func startAgent(t *testing.T, e *env, node, uuid string) string {
	t.Helper()
	stubtest.Need(t)
	bin := agentBinary(t)
	dir := t.TempDir()
	port, err := harness.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	metricsURL := fmt.Sprintf("http://127.0.0.1:%d", port)
	env := append(stubtest.Environ(), "GPUBROKER_STUB_STATE="+filepath.Join(dir, "stub.state"), "GPUBROKER_STUB_UUID="+uuid)
	p, err := harness.StartProcess("gpubroker-agent", filepath.Join(dir, "agent.log"), env, bin,
		"--node="+node, "--redis-url="+e.redis.URL(), "--redis-prefix="+redisschemaPrefix,
		"--kubeconfig="+e.cluster.AdminKubeconfig, "--host-root="+filepath.Join(dir, "host"),
		"--nvml-library="+filepath.Join(stubtest.StubDir(), "libnvidia-ml.so.1"),
		fmt.Sprintf("--metrics-addr=127.0.0.1:%d", port), "--heartbeat-interval=1s", "--sample-interval=1s")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Stop(10 * time.Second); err != nil {
			t.Errorf("stop agent: %v", err)
		}
		if t.Failed() {
			t.Logf("--- agent log, last 40 lines:\n%s", p.LogTail(40))
		}
	})
	if err := os.MkdirAll(filepath.Join(dir, "host"), 0o755); err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Timeout: 2 * time.Second}
	err = harness.Poll(t.Context(), 100*time.Millisecond, 30*time.Second, func(ctx context.Context) (bool, string, error) {
		select {
		case <-p.Exited():
			return false, "", fmt.Errorf("agent exited: %w\n%s", p.ExitErr(), p.LogTail(20))
		default:
		}
		resp, err := hc.Get(metricsURL + "/healthz")
		if err != nil {
			return false, err.Error(), nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status, nil
	})
	if err != nil {
		t.Fatalf("agent not healthy: %v\n%s", err, p.LogTail(20))
	}
	return metricsURL
}

// stubUUID returns a random NVML-style GPU UUID for the stub device
// (GPUBROKER_STUB_UUID takes only that form).
func stubUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux
	h := hex.EncodeToString(b[:])
	return "GPU-" + h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// redisschemaPrefix is the key prefix of the env's brokers (their
// default), which the agent must share.
const redisschemaPrefix = "gpubroker:"

// prometheus is a running Prometheus.
type prometheus struct {
	url string
	hc  *http.Client
}

// startPrometheus runs Debian's prometheus scraping each job's target
// (host:port) every second, with the alert rules loaded, and waits until
// it is ready and has scraped every target once.
func startPrometheus(t *testing.T, targets map[string]string) *prometheus {
	t.Helper()
	bin := testdeps.Need(t, "/usr/bin/prometheus")
	dir := t.TempDir()
	rules, err := filepath.Abs(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - %q\nscrape_configs:\n", rules)
	jobs := make([]string, 0, len(targets))
	for job := range targets {
		jobs = append(jobs, job)
	}
	sort.Strings(jobs)
	for _, job := range jobs {
		fmt.Fprintf(&cfg, "  - job_name: %q\n    static_configs:\n      - targets: [%q]\n", job, targets[job])
	}
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	port, err := harness.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	p, err := harness.StartProcess("prometheus", filepath.Join(dir, "prometheus.log"), os.Environ(), bin,
		"--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		fmt.Sprintf("--web.listen-address=127.0.0.1:%d", port), "--log.level=warn")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Stop(10 * time.Second); err != nil {
			t.Errorf("stop prometheus: %v", err)
		}
		if t.Failed() {
			t.Logf("--- prometheus log, last 30 lines:\n%s", p.LogTail(30))
		}
	})
	prom := &prometheus{url: fmt.Sprintf("http://127.0.0.1:%d", port), hc: &http.Client{Timeout: 10 * time.Second}}
	err = harness.Poll(t.Context(), 200*time.Millisecond, 60*time.Second, func(ctx context.Context) (bool, string, error) {
		select {
		case <-p.Exited():
			return false, "", fmt.Errorf("prometheus exited: %w\n%s", p.ExitErr(), p.LogTail(20))
		default:
		}
		n, err := prom.count(ctx, "up == 1")
		if err != nil {
			return false, err.Error(), nil
		}
		return n == len(targets), fmt.Sprintf("%d of %d targets up", n, len(targets)), nil
	})
	if err != nil {
		t.Fatalf("prometheus: %v", err)
	}
	return prom
}

// apiResult is the part of a Prometheus HTTP API answer the test reads.
type apiResult struct {
	Status    string          `json:"status"`
	Error     string          `json:"error"`
	ErrorType string          `json:"errorType"`
	Data      json.RawMessage `json:"data"`
}

func (p *prometheus) get(ctx context.Context, path string, q url.Values) (json.RawMessage, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url+path+"?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := p.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, err
	}
	var r apiResult
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %s: %w", path, b, err)
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("%s: %s: %s", path, r.ErrorType, r.Error)
	}
	return r.Data, nil
}

// count evaluates expr now and returns the number of series (1 for a
// scalar). A query Prometheus refuses is an error.
func (p *prometheus) count(ctx context.Context, expr string) (int, error) {
	data, err := p.get(ctx, "/api/v1/query", url.Values{"query": {expr}})
	if err != nil {
		return 0, err
	}
	var d struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		return 0, err
	}
	if d.ResultType == "scalar" || d.ResultType == "string" {
		return 1, nil
	}
	var series []json.RawMessage
	if err := json.Unmarshal(d.Result, &series); err != nil {
		return 0, err
	}
	return len(series), nil
}

// rules returns every loaded rule's health by name.
func (p *prometheus) rules(ctx context.Context) (map[string]string, error) {
	data, err := p.get(ctx, "/api/v1/rules", url.Values{})
	if err != nil {
		return nil, err
	}
	var d struct {
		Groups []struct {
			Rules []struct {
				Name   string `json:"name"`
				Health string `json:"health"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, g := range d.Groups {
		for _, r := range g.Rules {
			out[r.Name] = r.Health
		}
	}
	return out, nil
}

// query is one PromQL expression and where it comes from.
type query struct{ from, expr string }

// Grafana's interval variables, as the test evaluates them: rates over a
// window of 20 one-second scrapes, the dashboard's range two minutes.
var grafanaVars = strings.NewReplacer("$__rate_interval", "20s", "$__interval", "5s", "$__range", "2m")

// dashboardQueries returns every target expression of the dashboard's
// panels (rows' panels included), with Grafana's variables replaced.
func dashboardQueries(t *testing.T) []query {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	type panel struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
		Panels []json.RawMessage `json:"panels"`
	}
	var dash struct {
		Panels []json.RawMessage `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	var out []query
	var walk func(raw []json.RawMessage)
	walk = func(raw []json.RawMessage) {
		for _, r := range raw {
			var p panel
			if err := json.Unmarshal(r, &p); err != nil {
				t.Fatalf("%s: panel: %v", dashboardFile, err)
			}
			for _, tg := range p.Targets {
				out = append(out, query{from: "panel " + p.Title, expr: grafanaVars.Replace(tg.Expr)})
			}
			walk(p.Panels)
		}
	}
	walk(dash.Panels)
	if len(out) == 0 {
		t.Fatalf("%s has no queries", dashboardFile)
	}
	return out
}

// alertRule is one alert of the rules file.
type alertRule struct{ name, expr string }

// alertRules reads the alerts of the rules file (Prometheus's own format).
func alertRules(t *testing.T) []alertRule {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Rules []struct {
				Alert string `json:"alert"`
				Expr  string `json:"expr"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	var out []alertRule
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			out = append(out, alertRule{name: r.Alert, expr: r.Expr})
		}
	}
	return out
}

// boolComparisons adds the bool modifier to every comparison operator of
// a PromQL expression (outside label matchers and strings), so that the
// comparison returns 0 or 1 for every series instead of filtering: a
// healthy fleet then still has series for an alert's expression.
func boolComparisons(expr string) string {
	var out strings.Builder
	depth := 0 // inside {…}
	var quote byte
	for i := 0; i < len(expr); i++ {
		c := expr[i]
		switch {
		case quote != 0:
			if c == '\\' && i+1 < len(expr) {
				out.WriteByte(c)
				i++
				c = expr[i]
			} else if c == quote {
				quote = 0
			}
		case c == '"' || c == '\'' || c == '`':
			quote = c
		case c == '{':
			depth++
		case c == '}':
			depth--
		case depth == 0 && (c == '=' || c == '!' || c == '>' || c == '<'):
			op := string(c)
			if i+1 < len(expr) && expr[i+1] == '=' {
				op += "="
			}
			if op == "=" || op == "!" {
				break // not a comparison (=~ and !~ live in matchers)
			}
			out.WriteString(op)
			i += len(op) - 1
			if rest := strings.TrimLeft(expr[i+1:], " \t\n"); !strings.HasPrefix(rest, "bool") {
				out.WriteString(" bool")
			}
			continue
		}
		out.WriteByte(c)
	}
	return out.String()
}

func TestBoolComparisons(t *testing.T) {
	tests := []struct{ in, want string }{
		{`up{job="gpubroker"} == 0`, `up{job="gpubroker"} == bool 0`},
		{`a{x!="y",z=~"w"} >= 3 and b > bool 1`, `a{x!="y",z=~"w"} >= bool 3 and b > bool 1`},
		{`time() - max by (node) (m{l=">"}) > 60`, `time() - max by (node) (m{l=">"}) > bool 60`},
		{`sum(rate(x[5m]))`, `sum(rate(x[5m]))`},
	}
	for _, tc := range tests {
		if got := boolComparisons(tc.in); got != tc.want {
			t.Errorf("boolComparisons(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
