package render

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.yaml.in/yaml/v3"
)

var update = flag.Bool("update", false, "rewrite the values table in the chart's README")

// TestSchemaRefusesBadValues feeds values of the wrong type, range or form
// and wants Helm's schema error to name the value and what is wrong, so the
// person running helm install can fix it.
func TestSchemaRefusesBadValues(t *testing.T) {
	tests := []struct {
		name, values string
		want         []string // fragments of the error, in any order
	}{
		{"replicas below one", `broker: {replicas: 0}`, []string{"/broker/replicas", "minimum"}},
		{"replicas as text", `broker: {replicas: two}`, []string{"/broker/replicas", "got string, want integer"}},
		{"unknown value", `broker: {replica: 3}`, []string{"/broker", "additional properties 'replica' not allowed"}},
		{"unknown top-level value", `brokers: {}`, []string{"additional properties 'brokers' not allowed"}},
		{"notebook mode", `notebooks: {mode: subdomain}`, []string{"/notebooks/mode", "'host'", "'path'"}},
		{"anti-affinity", `broker: {antiAffinity: strict}`, []string{"/broker/antiAffinity", "'soft'", "'hard'", "'none'"}},
		{"namespace name", `notebooks: {namespace: Notebooks_NS}`, []string{"/notebooks/namespace", "does not match pattern"}},
		{"domain with a wildcard", `notebooks: {domain: "*.nb.example.org"}`, []string{"/notebooks/domain", "does not match pattern"}},
		{"issuer not a URL", `broker: {oidc: {issuer: idp.example.org}}`, []string{"/broker/oidc/issuer", "does not match pattern"}},
		{"redis URL scheme", `redis: {url: "http://redis:6379"}`, []string{"/redis/url", "does not match pattern"}},
		{"sentinel address", `redis: {url: "", sentinel: {master: m, addrs: [sentinel-0]}}`, []string{"/redis/sentinel/addrs/0", "does not match pattern"}},
		{"redis prefix with a brace", `redis: {prefix: "gb{x}:"}`, []string{"/redis/prefix", "does not match pattern"}},
		{"secret with an empty key", `broker: {hub: {token: {name: hub, key: ""}}}`, []string{"/broker/hub/token/key", "minLength"}},
		{"label value not a string", `agent: {nodeSelector: {gpu: true}}`, []string{"/agent/nodeSelector/gpu", "got boolean, want string"}},
		{"placement policy", `broker: {placementPolicy: random}`, []string{"/broker/placementPolicy", "'binpack'", "'spread'"}},
		{"gpu exposure", `broker: {gpuExposure: device-plugin}`, []string{"/broker/gpuExposure", "'nvidia-runtime'", "'cdi'"}},
		{"enforce mode", `agent: {enforce: stop}`, []string{"/agent/enforce", "'kill'"}},
		{"metrics port", `broker: {metrics: {port: 70000}}`, []string{"/broker/metrics/port", "maximum"}},
		{"profile compute over 100", `profiles: [{name: big, image: i, slice: {memoryMiB: 1024, computePercent: 150}}]`,
			[]string{"/profiles/0/slice/computePercent", "maximum"}},
		{"profile without slice", `profiles: [{name: big, image: i}]`, []string{"/profiles/0", "missing property 'slice'"}},
		{"profile sharing mode", `profiles: [{name: big, image: i, sharing: timeshare, slice: {memoryMiB: 1, computePercent: 1}}]`,
			[]string{"/profiles/0/sharing", "'sliced'", "'mps'"}},
		{"mig profile name", `profiles: [{name: m, image: i, sharing: mig, migProfile: 3g}]`, []string{"/profiles/0/migProfile", "does not match pattern"}},
		{"whole device with a slice", `profiles: [{name: x, image: i, sharing: exclusive, slice: {memoryMiB: 1, computePercent: 1}}]`,
			[]string{"/profiles/0", "not"}},
		{"mps without a slice", `profiles: [{name: m, image: i, sharing: mps}]`, []string{"/profiles/0", "missing property 'slice'"}},
		{"profile with an unknown field", `profiles: [{name: big, image: i, slice: {memoryMiB: 1, computePercent: 1}, gpus: 2}]`,
			[]string{"/profiles/0", "additional properties 'gpus' not allowed"}},
		{"no profiles", `profiles: []`, []string{"/profiles", "minItems"}},
		{"quota below zero", `quotas: {defaultUser: {servers: -1}}`, []string{"/quotas/defaultUser/servers", "minimum"}},
		{"resources quantity", `broker: {resources: {requests: {memory: lots}}}`, []string{"/broker/resources/requests/memory", "does not match pattern"}},
		{"setting name", `broker: {settings: {Reconcile_Interval: 1m}}`, []string{"/broker/settings", "additional properties 'Reconcile_Interval' not allowed"}},
		{"scrape interval", `monitoring: {serviceMonitor: {interval: often}}`, []string{"/monitoring/serviceMonitor/interval", "does not match pattern"}},
		{"network policy peer", `networkPolicy: {brokerFrom: [{pods: {app: x}}]}`, []string{"/networkPolicy/brokerFrom/0", "additional properties 'pods' not allowed"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := RenderExample("minimal", tc.values)
			if err == nil {
				t.Fatalf("values %s rendered; want the schema to refuse them", tc.values)
			}
			msg := err.Error()
			if !strings.Contains(msg, "values don't meet the specifications of the schema") {
				t.Errorf("not a schema error: %s", msg)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error lacks %q:\n%s", w, msg)
				}
			}
		})
	}
}

// TestSchemaTakesEverySharingMode: profiles of each sharing mode render,
// the whole-device ones without a slice.
func TestSchemaTakesEverySharingMode(t *testing.T) {
	values := `profiles:
  - {name: s, image: i, slice: {memoryMiB: 8192, computePercent: 10}}
  - {name: x, image: i, sharing: exclusive}
  - {name: m, image: i, sharing: mig, migProfile: 3g.71gb}
  - {name: p, image: i, sharing: mps, slice: {memoryMiB: 16384, computePercent: 25}}`
	if _, err := RenderExample("minimal", values); err != nil {
		t.Errorf("profiles of every sharing mode: %v", err)
	}
}

// TestChartRefusesContradictions covers what one value alone cannot say:
// each failure names the values to change.
func TestChartRefusesContradictions(t *testing.T) {
	tests := []struct {
		name, values, want string
	}{
		{"no Redis", `redis: {url: ""}`, "redis: set exactly one of redis.url, redis.sentinel"},
		{"two Redis", `redis: {sentinel: {master: m, addrs: ["s:26379"]}}`, "redis: set exactly one of redis.url, redis.sentinel"},
		{"trial Redis next to a URL", `redis: {inChart: {enabled: true}}`, "redis: set exactly one of"},
		{"Sentinel without addresses", `redis: {url: "", sentinel: {master: m}}`, "redis.sentinel: set both master and addrs"},
		{"trial Redis with a password", `redis: {url: "", inChart: {enabled: true}, password: {name: p, key: k}}`, "the trial Redis (redis.inChart) has no password"},
		{"no issuer", `broker: {oidc: {issuer: ""}}`, "broker.oidc.issuer is required"},
		{"no audience", `broker: {oidc: {audience: ""}}`, "broker.oidc.audience is required"},
		{"host mode without a domain", `notebooks: {domain: ""}`, "notebooks.domain is required with notebooks.mode=host"},
		{"hub URL without its token", `broker: {hub: {url: "http://hub:8081/"}}`, "broker.hub.apiToken.name is required with broker.hub.url"},
		{"Ingress without a host", `ingress: {enabled: true}`, "ingress.host is required with ingress.enabled"},
		{"a setting the chart owns", `broker: {settings: {namespace: other}}`, "broker.settings.namespace: the chart sets --namespace from its own values"},
		{"an agent setting the chart owns", `agent: {settings: {redis-url: "redis://x:1"}}`, "agent.settings.redis-url: the chart sets --redis-url"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := RenderExample("minimal", tc.values)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("values %s: error %v, want one saying %q", tc.values, err, tc.want)
			}
		})
	}
	if _, err := RenderExample("minimal"); err != nil {
		t.Fatalf("the minimal values do not render: %v", err)
	}
}

// TestSettingsCannotOverrideTheChart: every variable the chart sets from
// its own values, in any example, is refused as a broker.settings or
// agent.settings entry, so the two can never disagree.
func TestSettingsCannotOverrideTheChart(t *testing.T) {
	examples, err := Examples()
	if err != nil {
		t.Fatal(err)
	}
	flags := map[string]map[string]bool{"broker": {}, "agent": {}}
	for _, ex := range examples {
		r, err := Render(Options{Values: []string{ex.Values}})
		if err != nil {
			t.Fatalf("%s: %v", ex.Name, err)
		}
		dep, _ := r.Deployment("broker")
		for _, e := range dep.Spec.Template.Spec.Containers[0].Env {
			flags["broker"][strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(e.Name, "GPUBROKER_"), "_", "-"))] = true
		}
		if ds, err := r.DaemonSet("agent"); err == nil {
			for _, e := range ds.Spec.Template.Spec.Containers[0].Env {
				if name, ok := strings.CutPrefix(e.Name, "GPUBROKER_AGENT_"); ok {
					flags["agent"][strings.ToLower(strings.ReplaceAll(name, "_", "-"))] = true
				}
			}
		}
	}
	for part, names := range flags {
		for name := range names {
			_, err := RenderExample("minimal", fmt.Sprintf("%s: {settings: {%s: x}}", part, name))
			if err == nil || !strings.Contains(err.Error(), "the chart sets --"+name) {
				t.Errorf("%s.settings.%s is accepted next to the chart's own value: %v", part, name, err)
			}
		}
	}
	r, err := RenderExample("minimal", "broker: {settings: {reconcile-interval: 1m, kube-api-qps: 80}}\nagent: {settings: {sample-interval: 2s}}")
	if err != nil {
		t.Fatal(err)
	}
	dep, _ := r.Deployment("broker")
	ds, _ := r.DaemonSet("agent")
	if env := envOf(dep.Spec.Template.Spec.Containers[0]); env["GPUBROKER_RECONCILE_INTERVAL"] != "1m" || env["GPUBROKER_KUBE_API_QPS"] != "80" {
		t.Errorf("broker.settings did not become variables: %v", env)
	}
	if env := envOf(ds.Spec.Template.Spec.Containers[0]); env["GPUBROKER_AGENT_SAMPLE_INTERVAL"] != "2s" {
		t.Errorf("agent.settings did not become variables: %v", env)
	}
}

// valueDoc is one documented value of values.yaml.
type valueDoc struct {
	path, def, doc string
}

// documentedValues walks values.yaml: each key with a "# --" comment is a
// value (its children, if any, are part of it); keys without one are
// sections to descend. An undocumented leaf is an error.
func documentedValues(t *testing.T) []valueDoc {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(Dir(), "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var root yaml.Node
	if err := yaml.Unmarshal(b, &root); err != nil {
		t.Fatal(err)
	}
	var out []valueDoc
	var walk func(prefix string, n *yaml.Node)
	walk = func(prefix string, n *yaml.Node) {
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, val := n.Content[i], n.Content[i+1]
			path := prefix + k.Value
			if doc, ok := strings.CutPrefix(strings.TrimSpace(lastComment(k.HeadComment)), "# --"); ok {
				def, err := yaml.Marshal(val)
				if err != nil {
					t.Fatal(err)
				}
				out = append(out, valueDoc{path: path, def: flowYAML(t, def), doc: strings.TrimSpace(doc)})
				continue
			}
			if val.Kind != yaml.MappingNode || len(val.Content) == 0 {
				t.Errorf("values.yaml: %s has no \"# --\" comment saying what it is", path)
				continue
			}
			walk(path+".", val)
		}
	}
	walk("", root.Content[0])
	return out
}

func lastComment(c string) string {
	lines := strings.Split(strings.TrimSpace(c), "\n")
	return lines[len(lines)-1]
}

// flowYAML renders a default on one line: JSON for collections, the plain
// scalar otherwise.
func flowYAML(t *testing.T, y []byte) string {
	t.Helper()
	var v any
	if err := yaml.Unmarshal(y, &v); err != nil {
		t.Fatal(err)
	}
	switch v.(type) {
	case map[string]any, []any:
		j, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return string(j)
	case string:
		return fmt.Sprintf("%q", v)
	}
	return strings.TrimSpace(string(y))
}

// TestValuesAreDocumentedAndInTheSchema: every value of values.yaml has a
// description, the schema knows it, and the chart's README lists it with
// its default (go test -update rewrites the table).
func TestValuesAreDocumentedAndInTheSchema(t *testing.T) {
	docs := documentedValues(t)
	b, err := os.ReadFile(filepath.Join(Dir(), "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema map[string]any
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatalf("values.schema.json: %v", err)
	}
	for _, d := range docs {
		if !schemaHas(schema, schema, strings.Split(d.path, ".")) {
			t.Errorf("values.schema.json does not describe %s", d.path)
		}
	}
	// And the other way round: every property the schema allows is a value
	// of values.yaml (global aside, Helm's own).
	var undocumented []string
	var walk func(prefix string, s map[string]any)
	walk = func(prefix string, s map[string]any) {
		props, _ := s["properties"].(map[string]any)
		for name, sub := range props {
			path := prefix + name
			if path == "global" || slices.ContainsFunc(docs, func(d valueDoc) bool { return d.path == path }) {
				continue
			}
			if !slices.ContainsFunc(docs, func(d valueDoc) bool { return strings.HasPrefix(d.path, path+".") }) {
				undocumented = append(undocumented, path)
				continue
			}
			walk(path+".", resolve(schema, sub.(map[string]any)))
		}
	}
	walk("", schema)
	if len(undocumented) > 0 {
		slices.Sort(undocumented)
		t.Errorf("values.schema.json allows values that values.yaml neither sets nor documents: %v", undocumented)
	}

	var table strings.Builder
	table.WriteString("| value | default | meaning |\n|---|---|---|\n")
	for _, d := range docs {
		fmt.Fprintf(&table, "| `%s` | `%s` | %s |\n", d.path, strings.ReplaceAll(d.def, "|", `\|`), strings.ReplaceAll(d.doc, "|", `\|`))
	}
	readme := filepath.Join(Dir(), "README.md")
	rb, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(rb)
	i, j := strings.Index(doc, tableBegin), strings.Index(doc, tableEnd)
	if i < 0 || j < i {
		t.Fatalf("%s has no values table: put these two lines around it (go test -update fills it in):\n%s%s", readme, tableBegin, tableEnd)
	}
	found := doc[i+len(tableBegin) : j]
	out := doc[:i+len(tableBegin)] + table.String() + doc[j:]
	if *update {
		if err := os.WriteFile(readme, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if diff := cmp.Diff(table.String(), found); diff != "" {
		t.Errorf("%s: the values table differs from values.yaml (-values.yaml +README); run go test ./deploy/helm/render -update:\n%s", readme, diff)
	}
}

// The markers around the values table in the chart's README.
const (
	tableBegin = "<!-- values: generated from the comments of values.yaml; go test ./deploy/helm/render -update rewrites it -->\n"
	tableEnd   = "<!-- end of values -->\n"
)

// schemaHas reports whether the schema s (refs resolved against root)
// describes the property path.
func schemaHas(root, s map[string]any, path []string) bool {
	s = resolve(root, s)
	if len(path) == 0 {
		return true
	}
	props, _ := s["properties"].(map[string]any)
	sub, ok := props[path[0]].(map[string]any)
	return ok && schemaHas(root, sub, path[1:])
}

func resolve(root, s map[string]any) map[string]any {
	ref, ok := s["$ref"].(string)
	if !ok {
		return s
	}
	name := strings.TrimPrefix(ref, "#/definitions/")
	return root["definitions"].(map[string]any)[name].(map[string]any)
}
