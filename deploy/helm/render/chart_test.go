package render

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/spawner"
)

// TestExamplesRender renders every documented combination of values (the
// chart's examples/) and checks what each promises: the broker hardened and
// probed, the agent on the selected nodes, least-privilege RBAC, Services
// that reach their pods, and the optional objects exactly when asked for.
func TestExamplesRender(t *testing.T) {
	examples, err := Examples()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, ex := range examples {
		t.Run(ex.Name, func(t *testing.T) {
			r, err := Render(Options{Values: []string{ex.Values}})
			if err != nil {
				t.Fatalf("render: %v", err)
			}
			v := values{r.Values}
			seen["ingress="+fmt.Sprint(v.b("ingress.enabled"))] = true
			seen["serviceMonitor="+fmt.Sprint(v.b("monitoring.serviceMonitor.enabled"))] = true
			seen["mode="+v.s("notebooks.mode")] = true
			seen["sentinel="+fmt.Sprint(v.s("redis.sentinel.master") != "")] = true
			seen["ha="+fmt.Sprint(v.i("broker.replicas") >= 3)] = true
			checkRelease(t, r, v)
		})
	}
	// The combinations: HA, Sentinel, host-mode notebooks, Ingress
	// on and off, ServiceMonitor on and off.
	for _, want := range []string{"ha=true", "sentinel=true", "mode=host", "mode=path", "ingress=true", "ingress=false",
		"serviceMonitor=true", "serviceMonitor=false"} {
		if !seen[want] {
			t.Errorf("no example covers %s", want)
		}
	}
}

// checkRelease checks one rendered release against its values.
func checkRelease(t *testing.T, r *Result, v values) {
	t.Helper()
	ns, nbNS := "gpubroker", v.s("notebooks.namespace")
	for _, kind := range []string{"ClusterRole", "ClusterRoleBinding"} {
		if got := r.OfKind(kind); len(got) > 0 {
			t.Errorf("the chart renders a %s (%s): nothing of gpubroker is cluster-wide", kind, Key(got[0]))
		}
	}
	for _, u := range r.Objects {
		if u.GetLabels()["app.kubernetes.io/instance"] != "gpubroker" || u.GetLabels()["app.kubernetes.io/part-of"] != "gpubroker" {
			t.Errorf("%s lacks the instance and part-of labels: %v", Key(u), u.GetLabels())
		}
		if u.GetKind() != "Namespace" && u.GetNamespace() == "" {
			t.Errorf("%s has no namespace", Key(u))
		}
	}

	dep, err := r.Deployment("broker")
	if err != nil {
		t.Fatal(err)
	}
	checkBroker(t, r, v, dep)
	pods := map[string]map[string]string{"broker": dep.Spec.Template.Labels}
	ports := map[string][]corev1.ContainerPort{"broker": dep.Spec.Template.Spec.Containers[0].Ports}

	if v.b("agent.enabled") {
		ds, err := r.DaemonSet("agent")
		if err != nil {
			t.Fatal(err)
		}
		checkAgent(t, v, ds)
		pods["agent"] = ds.Spec.Template.Labels
		ports["agent"] = ds.Spec.Template.Spec.Containers[0].Ports
	} else if got := r.OfKind("DaemonSet"); len(got) > 0 {
		t.Errorf("agent.enabled=false renders %s", Key(got[0]))
	}
	if v.b("redis.inChart.enabled") {
		redis, err := r.Deployment("redis-trial")
		if err != nil {
			t.Fatal(err)
		}
		pods["redis"] = redis.Spec.Template.Labels
		ports["redis"] = redis.Spec.Template.Spec.Containers[0].Ports
		if want := "redis://gpubroker-redis.gpubroker.svc:6379/0"; envOf(dep.Spec.Template.Spec.Containers[0])["GPUBROKER_REDIS_URL"] != want {
			t.Errorf("the broker does not use the trial Redis %s", want)
		}
	}

	checkRBAC(t, r, v, ns, nbNS)
	checkServices(t, r, pods, ports)
	checkNetworkPolicies(t, r, v, ns, nbNS, pods)

	nsObj := r.Find("Namespace", nbNS)
	if v.b("notebooks.createNamespace") != (nsObj != nil) {
		t.Errorf("notebooks namespace %s rendered %v, createNamespace %v", nbNS, nsObj != nil, v.b("notebooks.createNamespace"))
	} else if nsObj != nil && nsObj.GetAnnotations()["helm.sh/resource-policy"] != "keep" {
		t.Errorf("the notebooks namespace is deleted on uninstall (users' volumes with it): want helm.sh/resource-policy: keep")
	}

	ing := r.OfKind("Ingress")
	if v.b("ingress.enabled") != (len(ing) == 1) {
		t.Errorf("ingress.enabled=%v renders %d Ingresses", v.b("ingress.enabled"), len(ing))
	} else if len(ing) == 1 {
		checkIngress(t, r, v, ing[0])
	}

	checkMonitoring(t, r, v)

	cm := r.Find("ConfigMap", "gpubroker-profiles")
	if cm == nil {
		t.Fatal("no profiles ConfigMap")
	}
	var file map[string]any
	data, _, _ := unstructured.NestedString(cm.Object, "data", "profiles.yaml")
	if err := yaml.Unmarshal([]byte(data), &file); err != nil {
		t.Fatalf("profiles.yaml: %v", err)
	}
	if diff := cmp.Diff(map[string]any{"profiles": v.get("profiles"), "quotas": v.get("quotas")}, file); diff != "" {
		t.Errorf("profiles file differs from the values profiles and quotas (-values +file):\n%s", diff)
	}
}

func checkBroker(t *testing.T, r *Result, v values, dep *appsv1.Deployment) {
	t.Helper()
	if got, want := *dep.Spec.Replicas, int32(v.i("broker.replicas")); got != want {
		t.Errorf("replicas %d, want %d", got, want)
	}
	spec := dep.Spec.Template.Spec
	psc := spec.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("broker pod security context %+v: want runAsNonRoot and seccomp RuntimeDefault", psc)
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("%d broker containers, want 1", len(spec.Containers))
	}
	c := spec.Containers[0]
	sc := c.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 {
		t.Errorf("broker container security context %+v: want a read-only root, no privilege escalation, every capability dropped", sc)
	}
	if !slices.Equal(c.Args, []string{"serve"}) || len(c.Command) > 0 {
		t.Errorf("broker command %q args %q, want the image's entrypoint with [serve]", c.Command, c.Args)
	}
	if want := v.s("broker.image.repository") + ":" + "0.1.0"; v.s("broker.image.tag") == "" && c.Image != want {
		t.Errorf("broker image %s, want %s (the chart's appVersion)", c.Image, want)
	}
	for _, p := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{{"readiness", c.ReadinessProbe, "/readyz"}, {"liveness", c.LivenessProbe, "/healthz"}, {"startup", c.StartupProbe, "/healthz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil || p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port.String() != "http" {
			t.Errorf("%s probe %+v, want GET %s on port http", p.name, p.probe, p.path)
		}
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
		t.Errorf("broker resources %v: want cpu and memory requests", c.Resources)
	}
	env := envOf(c)
	for _, e := range c.Env {
		if !strings.HasPrefix(e.Name, "GPUBROKER_") || e.ValueFrom != nil {
			t.Errorf("broker env %s: want GPUBROKER_* variables with plain values (secrets come as files)", e.Name)
		}
	}
	if env["GPUBROKER_LEADER_ELECTION_NAMESPACE"] != dep.Namespace {
		t.Errorf("the reclaimer's Lease is in %q, want the release namespace %s", env["GPUBROKER_LEADER_ELECTION_NAMESPACE"], dep.Namespace)
	}
	if env["GPUBROKER_NAMESPACE"] != v.s("notebooks.namespace") {
		t.Errorf("GPUBROKER_NAMESPACE %q, want notebooks.namespace %q", env["GPUBROKER_NAMESPACE"], v.s("notebooks.namespace"))
	}
	checkMountedFiles(t, r, spec, c)

	aff := spec.Affinity
	switch v.s("broker.antiAffinity") {
	case "hard":
		if aff == nil || aff.PodAntiAffinity == nil || len(aff.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) != 1 ||
			!selects(aff.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution[0].LabelSelector, dep.Spec.Template.Labels) {
			t.Errorf("antiAffinity hard: want one required term over the broker's pods, got %+v", aff)
		}
	case "soft":
		if aff == nil || aff.PodAntiAffinity == nil || len(aff.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 1 ||
			!selects(aff.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm.LabelSelector, dep.Spec.Template.Labels) {
			t.Errorf("antiAffinity soft: want one preferred term over the broker's pods, got %+v", aff)
		}
	}

	pdbs := r.OfKind("PodDisruptionBudget")
	wantPDB := v.b("broker.podDisruptionBudget.enabled") && v.i("broker.replicas") > 1
	if wantPDB != (len(pdbs) == 1) {
		t.Errorf("%d PodDisruptionBudgets with %d replicas, enabled %v", len(pdbs), v.i("broker.replicas"), v.b("broker.podDisruptionBudget.enabled"))
	} else if wantPDB {
		var pdb policyv1.PodDisruptionBudget
		if err := Decode(pdbs[0], &pdb); err != nil {
			t.Fatal(err)
		}
		if !selects(pdb.Spec.Selector, dep.Spec.Template.Labels) || pdb.Spec.MaxUnavailable.IntValue() != v.i("broker.podDisruptionBudget.maxUnavailable") {
			t.Errorf("PodDisruptionBudget %+v does not cover the broker's pods with maxUnavailable %d", pdb.Spec, v.i("broker.podDisruptionBudget.maxUnavailable"))
		}
	}
}

// checkMountedFiles checks that every variable naming a file (…_FILE)
// points into a mounted volume that has that file: a key of a rendered
// ConfigMap, or an item of a Secret.
func checkMountedFiles(t *testing.T, r *Result, spec corev1.PodSpec, c corev1.Container) {
	t.Helper()
	volumes := map[string]corev1.Volume{}
	for _, vol := range spec.Volumes {
		volumes[vol.Name] = vol
	}
	for _, e := range c.Env {
		if !strings.HasSuffix(e.Name, "_FILE") {
			continue
		}
		found := false
		for _, m := range c.VolumeMounts {
			rel, ok := strings.CutPrefix(e.Value, m.MountPath+"/")
			if !ok {
				continue
			}
			found = true
			if !m.ReadOnly {
				t.Errorf("%s: %s is mounted read-write", e.Name, m.MountPath)
			}
			vol := volumes[m.Name]
			switch {
			case vol.ConfigMap != nil:
				cm := r.Find("ConfigMap", vol.ConfigMap.Name)
				if _, ok, _ := unstructured.NestedString(cm.Object, "data", rel); cm == nil || !ok {
					t.Errorf("%s=%s: ConfigMap %s has no key %s", e.Name, e.Value, vol.ConfigMap.Name, rel)
				}
			case vol.Secret != nil:
				if !slices.ContainsFunc(vol.Secret.Items, func(k corev1.KeyToPath) bool { return k.Path == rel }) {
					t.Errorf("%s=%s: volume %s does not project the key %s of Secret %s", e.Name, e.Value, m.Name, rel, vol.Secret.SecretName)
				}
			default:
				t.Errorf("%s: volume %s is neither a ConfigMap nor a Secret", e.Name, m.Name)
			}
		}
		if !found {
			t.Errorf("%s=%s is in no mounted volume", e.Name, e.Value)
		}
	}
}

func checkAgent(t *testing.T, v values, ds *appsv1.DaemonSet) {
	t.Helper()
	spec := ds.Spec.Template.Spec
	if !spec.HostPID {
		t.Error("the agent needs hostPID to map NVML pids to pods")
	}
	if spec.SecurityContext == nil || spec.SecurityContext.SeccompProfile == nil || spec.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("agent pod security context %+v: want seccomp RuntimeDefault", spec.SecurityContext)
	}
	want := map[string]string{}
	for k, val := range v.get("agent.nodeSelector").(map[string]any) {
		want[k] = fmt.Sprint(val)
	}
	if diff := cmp.Diff(want, spec.NodeSelector); diff != "" {
		t.Errorf("agent nodeSelector (-values +rendered):\n%s", diff)
	}
	c := spec.Containers[0]
	env := envOf(c)
	if env["GPUBROKER_AGENT_NAMESPACE"] != v.s("notebooks.namespace") {
		t.Errorf("GPUBROKER_AGENT_NAMESPACE %q, want notebooks.namespace %q (its Role is there only)", env["GPUBROKER_AGENT_NAMESPACE"], v.s("notebooks.namespace"))
	}
	for _, e := range c.Env {
		if e.Name == "GPUBROKER_AGENT_NODE" && (e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "spec.nodeName") {
			t.Errorf("GPUBROKER_AGENT_NODE must come from spec.nodeName, got %+v", e)
		}
	}
	if env["GPUBROKER_AGENT_HOST_ROOT"] != v.s("hostRoot") {
		t.Errorf("agent host root %q, want hostRoot %q", env["GPUBROKER_AGENT_HOST_ROOT"], v.s("hostRoot"))
	}
	for _, ctr := range append(slices.Clone(spec.InitContainers), c) {
		rw := slices.ContainsFunc(ctr.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == v.s("hostRoot") && !m.ReadOnly })
		if !rw {
			t.Errorf("agent container %s: host root %s must be mounted read-write", ctr.Name, v.s("hostRoot"))
		}
		if sc := ctr.SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Errorf("agent container %s: want a read-only root and no privilege escalation, got %+v", ctr.Name, sc)
		}
	}
	if len(spec.InitContainers) != 1 || spec.InitContainers[0].Name != "install-hook" {
		t.Errorf("agent init containers %v, want install-hook", spec.InitContainers)
	}
}

// checkRBAC checks the Roles: the broker's pods and Secrets in the
// notebooks' namespace only, its Lease in its own, the agent's read of pods;
// no wildcard, no pods/exec, no Secrets outside the notebooks' namespace.
func checkRBAC(t *testing.T, r *Result, v values, ns, nbNS string) {
	t.Helper()
	roles := map[string]rbacv1.Role{}
	for _, u := range r.OfKind("Role") {
		var role rbacv1.Role
		if err := Decode(u, &role); err != nil {
			t.Fatal(err)
		}
		roles[role.Namespace+"/"+role.Name] = role
		for _, rule := range role.Rules {
			if slices.Contains(rule.Verbs, "*") || slices.Contains(rule.Resources, "*") || slices.Contains(rule.APIGroups, "*") {
				t.Errorf("Role %s/%s has a wildcard rule %+v", role.Namespace, role.Name, rule)
			}
			for _, res := range rule.Resources {
				if strings.Contains(res, "/") {
					t.Errorf("Role %s/%s grants the subresource %s (no pods/exec, attach or the like)", role.Namespace, role.Name, res)
				}
				if res == "secrets" && role.Namespace != nbNS {
					t.Errorf("Role %s/%s grants Secrets outside the notebooks' namespace", role.Namespace, role.Name)
				}
			}
		}
	}
	want := []string{nbNS + "/gpubroker", ns + "/gpubroker-leader"}
	if v.b("agent.enabled") {
		want = append(want, nbNS+"/gpubroker-agent")
	}
	if diff := cmp.Diff(want, slices.Sorted(func(yield func(string) bool) {
		for k := range roles {
			if !yield(k) {
				return
			}
		}
	}), cmp.Transformer("sort", func(s []string) []string { return slices.Sorted(slices.Values(s)) })); diff != "" {
		t.Errorf("Roles (-want +rendered):\n%s", diff)
	}
	for _, u := range r.OfKind("RoleBinding") {
		var rb rbacv1.RoleBinding
		if err := Decode(u, &rb); err != nil {
			t.Fatal(err)
		}
		if _, ok := roles[rb.Namespace+"/"+rb.RoleRef.Name]; !ok || rb.RoleRef.Kind != "Role" {
			t.Errorf("RoleBinding %s/%s binds %s %s, not a Role of the chart in its namespace", rb.Namespace, rb.Name, rb.RoleRef.Kind, rb.RoleRef.Name)
		}
		for _, s := range rb.Subjects {
			if s.Kind != rbacv1.ServiceAccountKind || s.Namespace != ns || r.Find("ServiceAccount", s.Name) == nil {
				t.Errorf("RoleBinding %s/%s binds %+v, not a ServiceAccount of the chart", rb.Namespace, rb.Name, s)
			}
		}
	}
}

// checkServices checks that each Service selects the pods of one workload
// and that its named target ports exist there.
func checkServices(t *testing.T, r *Result, pods map[string]map[string]string, ports map[string][]corev1.ContainerPort) {
	t.Helper()
	for _, u := range r.OfKind("Service") {
		var svc corev1.Service
		if err := Decode(u, &svc); err != nil {
			t.Fatal(err)
		}
		var matched []string
		for w, lbls := range pods {
			if len(svc.Spec.Selector) > 0 && labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(lbls)) {
				matched = append(matched, w)
			}
		}
		if len(matched) != 1 {
			t.Errorf("Service %s selects %v, want the pods of one workload", svc.Name, matched)
			continue
		}
		for _, p := range svc.Spec.Ports {
			if !slices.ContainsFunc(ports[matched[0]], func(cp corev1.ContainerPort) bool { return cp.Name == p.TargetPort.String() }) {
				t.Errorf("Service %s port %s targets %s, which the %s pods do not have", svc.Name, p.Name, p.TargetPort.String(), matched[0])
			}
		}
	}
}

func checkNetworkPolicies(t *testing.T, r *Result, v values, ns, nbNS string, pods map[string]map[string]string) {
	t.Helper()
	policies := map[string]networkingv1.NetworkPolicy{}
	for _, u := range r.OfKind("NetworkPolicy") {
		var np networkingv1.NetworkPolicy
		if err := Decode(u, &np); err != nil {
			t.Fatal(err)
		}
		policies[np.Name] = np
	}
	if !v.b("networkPolicy.enabled") {
		if len(policies) > 0 {
			t.Errorf("networkPolicy.enabled=false renders %d NetworkPolicies", len(policies))
		}
		return
	}
	nb, ok := policies["gpubroker-notebooks"]
	if !ok || nb.Namespace != nbNS {
		t.Fatalf("no NetworkPolicy for the notebooks in %s", nbNS)
	}
	if !selects(&nb.Spec.PodSelector, map[string]string{v1.LabelManagedBy: v1.ManagedByValue}) || !slices.Equal(nb.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
		t.Errorf("notebooks policy selects %v for %v, want the notebook pods (%s=%s) for ingress", nb.Spec.PodSelector, nb.Spec.PolicyTypes, v1.LabelManagedBy, v1.ManagedByValue)
	}
	if len(nb.Spec.Ingress) != 1 || len(nb.Spec.Ingress[0].Ports) != 1 || nb.Spec.Ingress[0].Ports[0].Port.IntValue() != spawner.DefaultNotebookPort {
		t.Fatalf("notebooks policy ingress %+v, want one rule on the notebook port %d", nb.Spec.Ingress, spawner.DefaultNotebookPort)
	}
	type peer struct{ ns, pod string }
	var got []peer
	for _, p := range nb.Spec.Ingress[0].From {
		if p.NamespaceSelector == nil || p.PodSelector == nil || p.IPBlock != nil {
			t.Errorf("notebooks policy peer %+v: want a namespace and pod selector each", p)
			continue
		}
		got = append(got, peer{p.NamespaceSelector.MatchLabels[corev1.LabelMetadataName], labels.Set(p.PodSelector.MatchLabels).String()})
		if p.NamespaceSelector.MatchLabels[corev1.LabelMetadataName] == ns && !selects(p.PodSelector, pods["broker"]) {
			t.Errorf("notebooks policy peer %v does not select the broker's pods %v", p.PodSelector, pods["broker"])
		}
	}
	want := []peer{{ns, labels.Set(map[string]string{"app.kubernetes.io/name": "gpubroker", "app.kubernetes.io/instance": "gpubroker"}).String()}}
	if v.b("jupyterhub.enabled") {
		for _, sel := range v.get("jupyterhub.podSelectors").([]any) {
			m := map[string]string{}
			for k, val := range sel.(map[string]any) {
				m[k] = fmt.Sprint(val)
			}
			want = append(want, peer{v.s("jupyterhub.namespace"), labels.Set(m).String()})
		}
	}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(peer{})); diff != "" {
		t.Errorf("who reaches the notebooks (-want +rendered):\n%s", diff)
	}

	_, hasRedis := policies["gpubroker-redis"]
	if hasRedis != v.b("redis.inChart.enabled") {
		t.Errorf("Redis NetworkPolicy %v, trial Redis %v", hasRedis, v.b("redis.inChart.enabled"))
	}
	if hasRedis {
		rp := policies["gpubroker-redis"]
		if !selects(&rp.Spec.PodSelector, pods["redis"]) || len(rp.Spec.Ingress) != 1 {
			t.Fatalf("Redis policy %+v does not guard the Redis pods", rp.Spec)
		}
		var from []string
		for _, p := range rp.Spec.Ingress[0].From {
			for _, w := range []string{"broker", "agent"} {
				if p.NamespaceSelector == nil && selects(p.PodSelector, pods[w]) {
					from = append(from, w)
				}
			}
		}
		if !slices.Equal(from, []string{"broker", "agent"}) || len(rp.Spec.Ingress[0].From) != 2 {
			t.Errorf("Redis is reachable from %v (%d peers), want exactly the broker and the agents", from, len(rp.Spec.Ingress[0].From))
		}
	}
	if _, ok := policies["gpubroker"]; !ok {
		t.Error("no NetworkPolicy for the broker")
	}
}

func checkIngress(t *testing.T, r *Result, v values, u *unstructured.Unstructured) {
	t.Helper()
	var ing networkingv1.Ingress
	if err := Decode(u, &ing); err != nil {
		t.Fatal(err)
	}
	var hosts []string
	for _, rule := range ing.Spec.Rules {
		hosts = append(hosts, rule.Host)
		if rule.HTTP == nil || len(rule.HTTP.Paths) != 1 || rule.HTTP.Paths[0].Backend.Service == nil ||
			rule.HTTP.Paths[0].Backend.Service.Name != "gpubroker" || rule.HTTP.Paths[0].Backend.Service.Port.Name != "http" {
			t.Errorf("Ingress rule %s does not send / to the broker's Service port http", rule.Host)
		}
	}
	want := []string{v.s("ingress.host")}
	if v.s("notebooks.mode") == "host" {
		want = append(want, "*."+v.s("notebooks.domain"))
	}
	if !slices.Equal(hosts, want) {
		t.Errorf("Ingress hosts %v, want %v", hosts, want)
	}
	dep, _ := r.Deployment("broker")
	scheme := "http"
	if v.s("ingress.tlsSecret") != "" {
		scheme = "https"
	}
	if got, want := envOf(dep.Spec.Template.Spec.Containers[0])["GPUBROKER_PUBLIC_URL"], scheme+"://"+v.s("ingress.host"); v.s("broker.publicURL") == "" && got != want {
		t.Errorf("public URL %q, want %q from the Ingress", got, want)
	}
}

func checkMonitoring(t *testing.T, r *Result, v values) {
	t.Helper()
	sms := r.OfKind("ServiceMonitor")
	want := 0
	if v.b("monitoring.serviceMonitor.enabled") {
		want = 1
		if v.b("agent.enabled") {
			want = 2
		}
	}
	if len(sms) != want {
		t.Errorf("%d ServiceMonitors, want %d", len(sms), want)
	}
	for _, sm := range sms {
		sel, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
		eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
		var matched []string
		for _, svc := range r.OfKind("Service") {
			if labels.SelectorFromSet(sel).Matches(labels.Set(svc.GetLabels())) {
				matched = append(matched, svc.GetName())
				ports, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
				for _, ep := range eps {
					name := ep.(map[string]any)["port"]
					if !slices.ContainsFunc(ports, func(p any) bool { return p.(map[string]any)["name"] == name }) {
						t.Errorf("ServiceMonitor %s scrapes port %v, which Service %s lacks", sm.GetName(), name, svc.GetName())
					}
				}
			}
		}
		if len(matched) != 1 || !strings.HasSuffix(matched[0], "-metrics") {
			t.Errorf("ServiceMonitor %s selects Services %v, want one metrics Service", sm.GetName(), matched)
		}
		// The job is the one the alert rules and the dashboard select on.
		sel2 := sel["app.kubernetes.io/component"]
		want := map[string]string{"broker-metrics": "gpubroker", "agent-metrics": "gpubroker-agent"}[sel2]
		for _, ep := range eps {
			rl, _ := ep.(map[string]any)["relabelings"].([]any)
			if !slices.ContainsFunc(rl, func(r any) bool {
				m, _ := r.(map[string]any)
				return m["targetLabel"] == "job" && m["replacement"] == want && m["sourceLabels"] == nil
			}) {
				t.Errorf("ServiceMonitor %s (%s) does not set job=%q, the job the alert rules and the dashboard name", sm.GetName(), sel2, want)
			}
		}
	}
	if got := len(r.OfKind("PrometheusRule")) == 1; got != v.b("monitoring.prometheusRule.enabled") {
		t.Errorf("PrometheusRule rendered %v, enabled %v", got, v.b("monitoring.prometheusRule.enabled"))
	}
	dash := r.Find("ConfigMap", "gpubroker-dashboard")
	if (dash != nil) != v.b("monitoring.dashboard.enabled") {
		t.Errorf("dashboard ConfigMap rendered %v, enabled %v", dash != nil, v.b("monitoring.dashboard.enabled"))
	} else if dash != nil {
		data, _, _ := unstructured.NestedString(dash.Object, "data", "gpubroker.json")
		if !json.Valid([]byte(data)) {
			t.Error("the dashboard ConfigMap does not hold valid JSON")
		}
		for k, val := range v.get("monitoring.dashboard.labels").(map[string]any) {
			if dash.GetLabels()[k] != fmt.Sprint(val) {
				t.Errorf("dashboard ConfigMap lacks the sidecar label %s=%v", k, val)
			}
		}
	}
}

// values reads dotted paths out of rendered values.
type values struct{ m map[string]any }

func (v values) get(path string) any {
	var cur any = v.m
	for _, k := range strings.Split(path, ".") {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = m[k]
	}
	return cur
}

func (v values) s(path string) string {
	if x := v.get(path); x != nil {
		return fmt.Sprint(x)
	}
	return ""
}

func (v values) b(path string) bool { x, _ := v.get(path).(bool); return x }

func (v values) i(path string) int {
	switch x := v.get(path).(type) {
	case float64:
		return int(x)
	case int64:
		return int(x)
	case int:
		return x
	}
	return 0
}

func envOf(c corev1.Container) map[string]string {
	m := map[string]string{}
	for _, e := range c.Env {
		m[e.Name] = e.Value
	}
	return m
}

func selects(sel *metav1.LabelSelector, lbls map[string]string) bool {
	s, err := metav1.LabelSelectorAsSelector(sel)
	return err == nil && !s.Empty() && s.Matches(labels.Set(lbls))
}

// TestMonitoringFilesNameTheScrapeJobs: the alert rules and the dashboard
// select the broker's and the agents' series by job, and every job they
// name is one the chart's ServiceMonitors set (gpubroker, gpubroker-agent).
func TestMonitoringFilesNameTheScrapeJobs(t *testing.T) {
	jobs := regexp.MustCompile(`job\s*=~?\s*\\?"([^"\\]*)\\?"`)
	for _, f := range []string{"rules/gpubroker.rules.yaml", "dashboards/gpubroker.json"} {
		b, err := os.ReadFile(filepath.Join(Dir(), f))
		if err != nil {
			t.Fatal(err)
		}
		found := jobs.FindAllSubmatch(b, -1)
		if len(found) == 0 {
			t.Errorf("%s names no job", f)
		}
		for _, m := range found {
			if j := string(m[1]); j != "gpubroker" && j != "gpubroker-agent" {
				t.Errorf("%s selects job %q, which no ServiceMonitor of the chart sets", f, j)
			}
		}
	}
}
