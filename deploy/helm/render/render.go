package render

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/releaseutil"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"
)

// KubeVersion is the Kubernetes version the chart is rendered for by
// default: the e2e kube-apiserver's (k8s.io/kubernetes v1.37).
const KubeVersion = "v1.37.2"

// Options are one rendering of the chart.
type Options struct {
	// Release and Namespace are the release's name and namespace; defaults
	// "gpubroker" and "gpubroker".
	Release, Namespace string
	// Values are YAML documents merged over the chart's values.yaml in
	// order, later ones winning, as `helm --values a.yaml --values b.yaml`
	// merges them (maps merged key by key, anything else replaced; null
	// removes a default).
	Values []string
	// KubeVersion is the cluster's version for .Capabilities; "" means
	// KubeVersion.
	KubeVersion string
}

// Result is a rendered release.
type Result struct {
	// Objects are the rendered objects in Helm's install order (namespaces,
	// service accounts, RBAC, config, services, workloads, ...).
	Objects []*unstructured.Unstructured
	// Notes is NOTES.txt as rendered.
	Notes string
	// Values are the values the templates saw: values.yaml with Options'
	// documents merged over it.
	Values map[string]any
}

// Example is one documented combination of values: a file of the chart's
// examples/ folder, which its README lists.
type Example struct {
	// Name is the file name without .yaml ("ha-sentinel").
	Name string
	// Values is the file's content.
	Values string
}

// Examples returns the chart's examples, sorted by name.
func Examples() ([]Example, error) {
	files, err := filepath.Glob(filepath.Join(Dir(), "examples", "*.yaml"))
	if err != nil {
		return nil, fmt.Errorf("examples: %w", err)
	}
	var out []Example
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("examples: %w", err)
		}
		out = append(out, Example{Name: strings.TrimSuffix(filepath.Base(f), ".yaml"), Values: string(b)})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("examples: none in %s", filepath.Join(Dir(), "examples"))
	}
	return out, nil
}

// RenderExample renders the example of that name (examples/<name>.yaml)
// with more values documents merged after it, for the release gpubroker in
// the namespace gpubroker (Render's errors; an unknown name is one).
func RenderExample(name string, more ...string) (*Result, error) {
	examples, err := Examples()
	if err != nil {
		return nil, err
	}
	i := slices.IndexFunc(examples, func(e Example) bool { return e.Name == name })
	if i < 0 {
		return nil, fmt.Errorf("no example %q in %s", name, filepath.Join(Dir(), "examples"))
	}
	return Render(Options{Values: append([]string{examples[i].Values}, more...)})
}

// Dir returns the chart's directory in this checkout.
func Dir() string {
	_, self, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(self), "..", "gpubroker")
}

// Load loads the chart from Dir.
func Load() (*chart.Chart, error) {
	c, err := loader.Load(Dir())
	if err != nil {
		return nil, fmt.Errorf("load chart %s: %w", Dir(), err)
	}
	return c, nil
}

// Render renders the chart with o. Errors: a chart that does not load, a
// values document that is not YAML, values the schema refuses (Helm's
// message, naming each value and the rule), a Kubernetes version outside
// the chart's kubeVersion, a template that fails (the chart's own fail
// messages included), or a rendered document that is not a Kubernetes
// object.
func Render(o Options) (*Result, error) {
	c, err := Load()
	if err != nil {
		return nil, err
	}
	release, namespace := o.Release, o.Namespace
	if release == "" {
		release = "gpubroker"
	}
	if namespace == "" {
		namespace = "gpubroker"
	}
	kubeVersion := o.KubeVersion
	if kubeVersion == "" {
		kubeVersion = KubeVersion
	}
	if c.Metadata.KubeVersion != "" && !chartutil.IsCompatibleRange(c.Metadata.KubeVersion, kubeVersion) {
		return nil, fmt.Errorf("chart requires kubeVersion %s, which %s does not meet", c.Metadata.KubeVersion, kubeVersion)
	}
	user := map[string]any{}
	for i, doc := range o.Values {
		v, err := chartutil.ReadValues([]byte(doc))
		if err != nil {
			return nil, fmt.Errorf("values document %d: %w", i+1, err)
		}
		user = merge(user, v.AsMap())
	}
	caps := chartutil.DefaultCapabilities.Copy()
	kv, err := parseKubeVersion(kubeVersion)
	if err != nil {
		return nil, err
	}
	caps.KubeVersion = kv
	vals, err := chartutil.ToRenderValues(c, user, chartutil.ReleaseOptions{
		Name: release, Namespace: namespace, Revision: 1, IsInstall: true,
	}, caps)
	if err != nil {
		return nil, err
	}
	files, err := engine.Render(c, vals)
	if err != nil {
		return nil, err
	}
	res := &Result{Values: map[string]any(vals["Values"].(chartutil.Values))}
	for name, content := range files {
		if strings.HasSuffix(name, "NOTES.txt") {
			res.Notes = content
			delete(files, name)
		}
	}
	hooks, manifests, err := releaseutil.SortManifests(files, caps.APIVersions, releaseutil.InstallOrder)
	if err != nil {
		return nil, fmt.Errorf("sort manifests: %w", err)
	}
	if len(hooks) > 0 {
		return nil, fmt.Errorf("the chart renders %d hooks; this package applies plain objects only", len(hooks))
	}
	seen := map[string]string{}
	for _, m := range manifests {
		var obj map[string]any
		if err := yaml.UnmarshalStrict([]byte(m.Content), &obj); err != nil {
			return nil, fmt.Errorf("%s: not YAML: %w", m.Name, err)
		}
		if obj == nil {
			continue
		}
		u := &unstructured.Unstructured{Object: obj}
		if u.GetAPIVersion() == "" || u.GetKind() == "" || u.GetName() == "" {
			return nil, fmt.Errorf("%s: a document without apiVersion, kind or name:\n%s", m.Name, m.Content)
		}
		key := Key(u)
		if prev, dup := seen[key]; dup {
			return nil, fmt.Errorf("%s and %s both render %s", prev, m.Name, key)
		}
		seen[key] = m.Name
		res.Objects = append(res.Objects, u)
	}
	return res, nil
}

// Key names an object for messages and lookups: "Kind namespace/name", or
// "Kind name" for a cluster-scoped one.
func Key(u *unstructured.Unstructured) string {
	if u.GetNamespace() == "" {
		return u.GetKind() + " " + u.GetName()
	}
	return u.GetKind() + " " + u.GetNamespace() + "/" + u.GetName()
}

// Find returns the object of that kind and name (in any namespace), or nil.
func (r *Result) Find(kind, name string) *unstructured.Unstructured {
	for _, u := range r.Objects {
		if u.GetKind() == kind && u.GetName() == name {
			return u
		}
	}
	return nil
}

// OfKind returns the objects of a kind, in install order.
func (r *Result) OfKind(kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, u := range r.Objects {
		if u.GetKind() == kind {
			out = append(out, u)
		}
	}
	return out
}

// Deployment returns the only Deployment whose component label is
// component ("broker", "redis-trial"), decoded.
func (r *Result) Deployment(component string) (*appsv1.Deployment, error) {
	var d appsv1.Deployment
	return &d, r.typed("Deployment", component, &d)
}

// DaemonSet returns the only DaemonSet whose component label is component
// ("agent"), decoded.
func (r *Result) DaemonSet(component string) (*appsv1.DaemonSet, error) {
	var d appsv1.DaemonSet
	return &d, r.typed("DaemonSet", component, &d)
}

func (r *Result) typed(kind, component string, into any) error {
	var found []*unstructured.Unstructured
	for _, u := range r.OfKind(kind) {
		if u.GetLabels()["app.kubernetes.io/component"] == component {
			found = append(found, u)
		}
	}
	if len(found) != 1 {
		return fmt.Errorf("want one %s of component %s, rendered %d", kind, component, len(found))
	}
	return Decode(found[0], into)
}

// Decode converts u into a typed object (a pointer to a k8s.io/api type),
// refusing fields the type does not have.
func Decode(u *unstructured.Unstructured, into any) error {
	if err := kruntime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, into, true); err != nil {
		return fmt.Errorf("%s: %w", Key(u), err)
	}
	return nil
}

// merge merges src into dst as Helm merges --values files: maps key by
// key, every other value replaced. dst is changed and returned.
func merge(dst, src map[string]any) map[string]any {
	for k, v := range src {
		if sm, ok := v.(map[string]any); ok {
			if dm, ok := dst[k].(map[string]any); ok {
				dst[k] = merge(dm, sm)
				continue
			}
		}
		dst[k] = v
	}
	return dst
}

func parseKubeVersion(v string) (chartutil.KubeVersion, error) {
	parts := strings.SplitN(strings.TrimPrefix(v, "v"), ".", 3)
	if len(parts) < 2 {
		return chartutil.KubeVersion{}, errors.New("kube version " + v + ": want v<major>.<minor>[.<patch>]")
	}
	return chartutil.KubeVersion{Version: v, Major: parts[0], Minor: parts[1]}, nil
}
