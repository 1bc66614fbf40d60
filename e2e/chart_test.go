package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"

	"github.com/gpubroker/gpubroker/broker/devissuer"
	"github.com/gpubroker/gpubroker/broker/redistest"
	"github.com/gpubroker/gpubroker/deploy/helm/render"
	"github.com/gpubroker/gpubroker/e2e/harness"
)

// TestChartOnTheAPIServer installs every documented combination of the
// chart's values (its examples/) on the real kube-apiserver: each object is
// first applied with server-side dry-run (the API server's own schemas and
// admission), then for real. The service accounts can do what the broker
// and the agent need and nothing more (SubjectAccessReview), the broker's
// configuration passes `gpubroker serve --check-config` for every
// combination, and one install's broker runs with exactly its Deployment's
// args, environment and mounted files until it is ready.
func TestChartOnTheAPIServer(t *testing.T) {
	t.Parallel()
	c := needCluster(t)
	bin := brokerBinary(t)
	installMonitoringCRDs(t, c)
	examples, err := render.Examples()
	if err != nil {
		t.Fatal(err)
	}
	for _, ex := range examples {
		t.Run(ex.Name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			inst := installChart(t, c, ex, "")
			checkAccess(t, c, inst)
			for _, dep := range inst.deployments {
				if dep.Labels["app.kubernetes.io/component"] != "broker" {
					continue
				}
				pod := materialize(t, c, inst, dep.Spec.Template.Spec)
				cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
				cmd := exec.CommandContext(cctx, bin, append(slices.Clone(pod.container.Args), "--check-config")...)
				cmd.Env = append(pod.environ, "GPUBROKER_KUBECONFIG="+saKubeconfig(t, c, inst.ns, dep.Spec.Template.Spec.ServiceAccountName))
				b, err := cmd.CombinedOutput()
				cancel()
				out := string(b)
				if err != nil {
					t.Fatalf("gpubroker %s --check-config with the Deployment's environment: %v\n%s", strings.Join(pod.container.Args, " "), err, out)
				}
				checkWarnings(t, out)
			}
		})
	}

	// The broker runs from an install whose values name real parts: this
	// test's Redis and OIDC issuer.
	t.Run("broker-runs", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		redis := redistest.Start(t)
		issuer := devissuer.StartTest(t)
		i := slices.IndexFunc(examples, func(e render.Example) bool { return e.Name == "ingress-host" })
		if i < 0 {
			t.Fatal("no ingress-host example")
		}
		inst := installChart(t, c, examples[i], fmt.Sprintf("broker: {oidc: {issuer: %q}}\nredis: {url: %q}\n", issuer.URL(), redis.URL()))
		var dep *appsv1.Deployment
		for _, d := range inst.deployments {
			if d.Labels["app.kubernetes.io/component"] == "broker" {
				dep = d
			}
		}
		pod := materialize(t, c, inst, dep.Spec.Template.Spec)
		ports := map[string]string{} // container port name → where this process listens instead
		for _, p := range pod.container.Ports {
			port, err := harness.FreePort()
			if err != nil {
				t.Fatal(err)
			}
			ports[p.Name] = fmt.Sprintf("127.0.0.1:%d", port)
			pod.remapListen(fmt.Sprintf(":%d", p.ContainerPort), ports[p.Name])
		}
		env := append(slices.Clone(pod.environ), "GPUBROKER_KUBECONFIG="+saKubeconfig(t, c, inst.ns, dep.Spec.Template.Spec.ServiceAccountName))
		logPath := filepath.Join(t.TempDir(), "broker.log")
		p, err := harness.StartProcess("gpubroker", logPath, env, bin, pod.container.Args...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := p.Stop(15 * time.Second); err != nil {
				t.Errorf("stop broker: %v", err)
			}
			if t.Failed() {
				t.Logf("--- broker log:\n%s", harness.TailFile(logPath, 60))
			}
		})
		start := time.Now()
		for _, probe := range []struct {
			name string
			p    *corev1.Probe
		}{{"startup", pod.container.StartupProbe}, {"readiness", pod.container.ReadinessProbe}, {"liveness", pod.container.LivenessProbe}} {
			url := "http://" + ports[probe.p.HTTPGet.Port.String()] + probe.p.HTTPGet.Path
			if err := waitOK(ctx, url, p, 90*time.Second); err != nil {
				t.Fatalf("%s probe GET %s: %v", probe.name, url, err)
			}
		}
		t.Logf("broker ready in %s on its rendered configuration", time.Since(start).Round(time.Millisecond))
		b, _ := os.ReadFile(logPath)
		checkWarnings(t, string(b))
		// The reclaimer's Lease, written with the service account's rights.
		err = harness.Poll(ctx, 100*time.Millisecond, 30*time.Second, func(ctx context.Context) (bool, string, error) {
			l, err := c.Client.CoordinationV1().Leases(inst.ns).Get(ctx, "gpubroker-reclaimer", metav1.GetOptions{})
			if err != nil {
				return false, err.Error(), nil
			}
			return l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "", "no holder yet", nil
		})
		if err != nil {
			t.Errorf("the broker holds no Lease in %s: %v", inst.ns, err)
		}
	})
}

// install is one rendered and applied release.
type install struct {
	ns, notebooks string
	result        *render.Result
	deployments   []*appsv1.Deployment
	// secrets are the Secrets the values name, created before the install
	// (secrets by reference), by name.
	secrets map[string]*corev1.Secret
}

// installChart renders the example for a release in a namespace of its own
// (notebooks in another), with more values after it, creates the Secrets
// the values name, applies every object with server-side dry-run and then
// for real, and deletes both namespaces when t ends.
func installChart(t *testing.T, c *harness.Cluster, ex render.Example, more string) *install {
	t.Helper()
	ctx := t.Context()
	inst := &install{ns: harness.UniqueName("chart-" + ex.Name), secrets: map[string]*corev1.Secret{}}
	inst.notebooks = inst.ns + "-nb"
	r, err := render.Render(render.Options{Release: "gpubroker", Namespace: inst.ns,
		Values: []string{ex.Values, fmt.Sprintf("notebooks: {namespace: %s}\n%s", inst.notebooks, more)}})
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	inst.result = r
	if err := c.CreateNamespace(ctx, inst.ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), 30*time.Second)
		defer cancel()
		for _, ns := range []string{inst.ns, inst.notebooks} {
			if err := c.DeleteNamespace(ctx, ns); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
	})

	for _, u := range r.OfKind("Deployment") {
		var d appsv1.Deployment
		if err := render.Decode(u, &d); err != nil {
			t.Fatal(err)
		}
		inst.deployments = append(inst.deployments, &d)
		for _, vol := range d.Spec.Template.Spec.Volumes {
			if vol.Secret == nil || inst.secrets[vol.Secret.SecretName] != nil {
				continue
			}
			s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: vol.Secret.SecretName, Namespace: inst.ns}, StringData: map[string]string{}}
			for _, item := range vol.Secret.Items {
				s.StringData[item.Key] = harness.UniqueName("secret") + "\n"
			}
			created, err := c.Client.CoreV1().Secrets(inst.ns).Create(ctx, s, metav1.CreateOptions{})
			if err != nil {
				t.Fatalf("create the Secret the values name: %v", err)
			}
			inst.secrets[created.Name] = created
		}
	}

	dyn, err := dynamic.NewForConfig(c.RESTConfig)
	if err != nil {
		t.Fatal(err)
	}
	disc, err := discovery.NewDiscoveryClientForConfig(c.RESTConfig)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc))
	apply := func(u *unstructured.Unstructured, dryRun bool) error {
		m, err := mapper.RESTMapping(u.GroupVersionKind().GroupKind(), u.GroupVersionKind().Version)
		if err != nil {
			return fmt.Errorf("%s: %w", render.Key(u), err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			ri = dyn.Resource(m.Resource).Namespace(u.GetNamespace())
		}
		opts := metav1.ApplyOptions{FieldManager: "helm", Force: true}
		if dryRun {
			opts.DryRun = []string{metav1.DryRunAll}
		}
		if _, err := ri.Apply(ctx, u.GetName(), u, opts); err != nil {
			return fmt.Errorf("apply %s (dry run %v): %w", render.Key(u), dryRun, err)
		}
		return nil
	}
	// A dry-run create in a namespace that does not exist is refused, so
	// the chart's Namespace goes first: dry run, then for real.
	var rest []*unstructured.Unstructured
	for _, u := range r.Objects {
		if u.GetKind() != "Namespace" {
			rest = append(rest, u)
			continue
		}
		for _, dry := range []bool{true, false} {
			if err := apply(u, dry); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, dry := range []bool{true, false} {
		for _, u := range rest {
			if err := apply(u, dry); err != nil {
				t.Error(err)
			}
		}
		if t.Failed() {
			t.FailNow()
		}
	}
	return inst
}

// monitoringCRDs installs, once per cluster, the Prometheus Operator's
// ServiceMonitor and PrometheusRule kinds.
var monitoringCRDs sync.Once

// installMonitoringCRDs registers monitoring.coreos.com/v1 ServiceMonitor
// and PrometheusRule. Their real schemas are the operator's CRD manifests,
// which this closed network cannot fetch; these CRDs keep every field
// (x-kubernetes-preserve-unknown-fields), so the API server checks the
// objects' kind, name and namespace but not their spec. The spec's fields
// are checked by deploy/helm/render's tests (selectors, ports, rule groups).
func installMonitoringCRDs(t *testing.T, c *harness.Cluster) {
	t.Helper()
	var err error
	monitoringCRDs.Do(func() {
		client, e := apiextensionsClient(c)
		if e != nil {
			err = e
			return
		}
		preserve := true
		for _, k := range []struct{ kind, plural string }{{"ServiceMonitor", "servicemonitors"}, {"PrometheusRule", "prometheusrules"}} {
			crd := &apiextensionsv1.CustomResourceDefinition{
				ObjectMeta: metav1.ObjectMeta{Name: k.plural + ".monitoring.coreos.com"},
				Spec: apiextensionsv1.CustomResourceDefinitionSpec{
					Group: "monitoring.coreos.com",
					Names: apiextensionsv1.CustomResourceDefinitionNames{Kind: k.kind, ListKind: k.kind + "List", Plural: k.plural, Singular: strings.ToLower(k.kind)},
					Scope: apiextensionsv1.NamespaceScoped,
					Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true,
						Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
							Type: "object", XPreserveUnknownFields: &preserve}}}},
				},
			}
			if e := client.create(t.Context(), crd); e != nil {
				err = e
				return
			}
		}
	})
	if err != nil {
		t.Fatalf("monitoring CRDs: %v", err)
	}
}

// pod is a pod spec made runnable here: its container's environment with
// every mounted file materialized under a temporary root.
type pod struct {
	container corev1.Container
	environ   []string
}

// materialize writes the files the pod mounts (ConfigMaps and Secrets, read
// back from the API server) under a temporary root at their mount paths,
// and returns the container's environment with every value that names such
// a path moved under that root: nothing else differs from the rendered
// Deployment.
func materialize(t *testing.T, c *harness.Cluster, inst *install, spec corev1.PodSpec) pod {
	t.Helper()
	ctx := t.Context()
	root := t.TempDir()
	ctr := spec.Containers[0]
	volumes := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = v
	}
	for _, m := range ctr.VolumeMounts {
		vol := volumes[m.Name]
		files := map[string][]byte{}
		switch {
		case vol.ConfigMap != nil:
			cm, err := c.Client.CoreV1().ConfigMaps(inst.ns).Get(ctx, vol.ConfigMap.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range cm.Data {
				files[k] = []byte(v)
			}
		case vol.Secret != nil:
			s, err := c.Client.CoreV1().Secrets(inst.ns).Get(ctx, vol.Secret.SecretName, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for _, item := range vol.Secret.Items {
				files[item.Path] = s.Data[item.Key]
			}
		default:
			t.Fatalf("volume %s: only ConfigMaps and Secrets are materialized", m.Name)
		}
		dir := filepath.Join(root, m.MountPath)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, data := range files {
			if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	p := pod{container: ctr, environ: harness.Environ()}
	for _, e := range ctr.Env {
		if e.ValueFrom != nil {
			t.Fatalf("%s comes from %+v; the broker's environment is plain values", e.Name, e.ValueFrom)
		}
		v := e.Value
		for _, m := range ctr.VolumeMounts {
			if strings.HasPrefix(v, m.MountPath+"/") {
				v = filepath.Join(root, v)
			}
		}
		p.environ = append(p.environ, e.Name+"="+v)
	}
	return p
}

// saKubeconfig stands in for a pod's in-cluster config (the kubelet's
// KUBERNETES_SERVICE_* variables and the mounted token): a kubeconfig with a
// token of the pod's service account, the one variable the test adds to the
// rendered environment.
func saKubeconfig(t *testing.T, c *harness.Cluster, ns, sa string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "sa.kubeconfig")
	if err := c.ServiceAccountKubeconfig(t.Context(), ns, sa, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// remapListen points every variable whose value is the listen address from
// (":8080") at to ("127.0.0.1:41234"): a pod has its own network namespace,
// this process shares the machine's.
func (p *pod) remapListen(from, to string) {
	for i, kv := range p.environ {
		if k, v, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "GPUBROKER_") && v == from {
			p.environ[i] = k + "=" + to
		}
	}
}

// checkWarnings fails t for every warning in a broker's output: the chart
// sets only settings the broker knows.
func checkWarnings(t *testing.T, out string) {
	t.Helper()
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, ": warning: ") {
			continue
		}
		t.Errorf("the broker warns about the chart's configuration: %s", line)
	}
}

// checkAccess asks the API server (SubjectAccessReview) what the chart's
// service accounts may do: what the broker and the agent need, and none of
// the rest.
func checkAccess(t *testing.T, c *harness.Cluster, inst *install) {
	t.Helper()
	type ask struct {
		verb, group, resource, sub, ns string
		allowed                        bool
	}
	nb, own := inst.notebooks, inst.ns
	asks := map[string][]ask{"gpubroker": {
		{"create", "", "pods", "", nb, true}, {"get", "", "pods", "", nb, true}, {"list", "", "pods", "", nb, true},
		{"watch", "", "pods", "", nb, true}, {"delete", "", "pods", "", nb, true}, {"patch", "", "pods", "", nb, true},
		{"create", "", "secrets", "", nb, true}, {"get", "", "secrets", "", nb, true}, {"update", "", "secrets", "", nb, true},
		{"delete", "", "secrets", "", nb, true},
		// Listed (by label) only in the notebooks' namespace, by the
		// reconciler, which deletes those no server holds any more.
		{"list", "", "secrets", "", nb, true},
		{"get", "coordination.k8s.io", "leases", "", own, true}, {"create", "coordination.k8s.io", "leases", "", own, true},
		{"update", "coordination.k8s.io", "leases", "", own, true},
		// Nothing more: no Secrets watched, none outside the notebooks'
		// namespace, no exec, nothing cluster-wide, no RBAC of its own.
		{"watch", "", "secrets", "", nb, false}, {"get", "", "secrets", "", own, false},
		{"get", "", "secrets", "", "", false}, {"list", "", "secrets", "", "", false}, {"get", "", "secrets", "", "kube-system", false},
		{"create", "", "pods", "exec", nb, false}, {"get", "", "pods", "exec", nb, false}, {"create", "", "pods", "attach", nb, false},
		{"create", "", "pods", "", own, false}, {"list", "", "pods", "", "", false}, {"update", "", "pods", "", nb, false},
		{"create", "coordination.k8s.io", "leases", "", nb, false}, {"get", "", "nodes", "", "", false},
		{"get", "", "configmaps", "", own, false}, {"create", "rbac.authorization.k8s.io", "rolebindings", "", nb, false},
		{"create", "", "namespaces", "", "", false},
	}}
	if inst.result.Find("DaemonSet", "gpubroker-agent") != nil {
		asks["gpubroker-agent"] = []ask{
			{"list", "", "pods", "", nb, true}, {"watch", "", "pods", "", nb, true},
			{"get", "", "secrets", "", nb, false}, {"list", "", "secrets", "", "", false}, {"list", "", "pods", "", "", false},
			{"list", "", "pods", "", own, false}, {"delete", "", "pods", "", nb, false}, {"create", "", "pods", "exec", nb, false},
			{"get", "", "nodes", "", "", false}, {"update", "coordination.k8s.io", "leases", "", own, false},
		}
	}
	for sa, list := range asks {
		user := "system:serviceaccount:" + own + ":" + sa
		for _, a := range list {
			review, err := c.Client.AuthorizationV1().SubjectAccessReviews().Create(t.Context(), &authorizationv1.SubjectAccessReview{
				Spec: authorizationv1.SubjectAccessReviewSpec{
					User:   user,
					Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + own, "system:authenticated"},
					ResourceAttributes: &authorizationv1.ResourceAttributes{
						Namespace: a.ns, Verb: a.verb, Group: a.group, Resource: a.resource, Subresource: a.sub,
					},
				},
			}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if review.Status.Allowed != a.allowed {
				where := a.ns
				if where == "" {
					where = "every namespace"
				}
				t.Errorf("%s may %s %s%s in %s: %v, want %v (%s)", sa, a.verb, a.resource, strings.TrimSuffix("/"+a.sub, "/"), where, review.Status.Allowed, a.allowed, review.Status.Reason)
			}
		}
	}
}

// waitOK polls url until it answers 200, p exits or timeout passes.
func waitOK(ctx context.Context, url string, p *harness.Process, timeout time.Duration) error {
	hc := &http.Client{Timeout: 2 * time.Second}
	defer hc.CloseIdleConnections()
	return harness.Poll(ctx, 50*time.Millisecond, timeout, func(ctx context.Context) (bool, string, error) {
		select {
		case <-p.Exited():
			return false, "", fmt.Errorf("exited: %w", p.ExitErr())
		default:
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false, "", err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return false, err.Error(), nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status, nil
	})
}

// crdClient creates CRDs and waits until they are established.
type crdClient struct{ dyn dynamic.Interface }

func apiextensionsClient(c *harness.Cluster) (crdClient, error) {
	dyn, err := dynamic.NewForConfig(c.RESTConfig)
	return crdClient{dyn}, err
}

func (cc crdClient) create(ctx context.Context, crd *apiextensionsv1.CustomResourceDefinition) error {
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(crd)
	if err != nil {
		return err
	}
	res := apiextensionsv1.SchemeGroupVersion.WithResource("customresourcedefinitions")
	u := &unstructured.Unstructured{Object: obj}
	u.SetAPIVersion("apiextensions.k8s.io/v1")
	u.SetKind("CustomResourceDefinition")
	if _, err := cc.dyn.Resource(res).Create(ctx, u, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create %s: %w", crd.Name, err)
	}
	return harness.Poll(ctx, 100*time.Millisecond, 30*time.Second, func(ctx context.Context) (bool, string, error) {
		got, err := cc.dyn.Resource(res).Get(ctx, crd.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		var cur apiextensionsv1.CustomResourceDefinition
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(got.Object, &cur); err != nil {
			return false, "", err
		}
		for _, cond := range cur.Status.Conditions {
			if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
				return true, "", nil
			}
		}
		return false, crd.Name + " not established", nil
	})
}
