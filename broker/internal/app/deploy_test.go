package app

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/gpubroker/gpubroker/broker/internal/catalog"
	"github.com/gpubroker/gpubroker/broker/internal/config"
)

// deployObjects decodes every manifest of deploy/broker.
func deployObjects(t *testing.T) []runtime.Object {
	t.Helper()
	files, err := filepath.Glob("../../../deploy/broker/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("deploy manifests: %v (found %d)", err, len(files))
	}
	var out []runtime.Object
	for _, f := range files {
		if filepath.Base(f) == "kustomization.yaml" {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range bytes.Split(data, []byte("\n---\n")) {
			obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
			if err != nil {
				t.Fatalf("%s document %d: %v", f, i, err)
			}
			out = append(out, obj)
		}
	}
	return out
}

// TestDeployManifestsMatchTheBroker keeps deploy/broker true to the code: the
// Deployment's environment loads as a serve config, the example profiles
// parse, and the Role grants what the spawner does in the notebooks namespace.
func TestDeployManifestsMatchTheBroker(t *testing.T) {
	var dep *appsv1.Deployment
	var role, leader *rbacv1.Role
	var profiles *corev1.ConfigMap
	for _, o := range deployObjects(t) {
		switch v := o.(type) {
		case *appsv1.Deployment:
			dep = v
		case *rbacv1.Role:
			if v.Name == "gpubroker-leader" {
				leader = v
			} else {
				role = v
			}
		case *corev1.ConfigMap:
			profiles = v
		}
	}
	if dep == nil || role == nil || profiles == nil {
		t.Fatalf("want a Deployment, a Role and a ConfigMap; got %v %v %v", dep != nil, role != nil, profiles != nil)
	}

	// Files the Deployment mounts are made under a temp dir, the profiles
	// file with the ConfigMap's content, so the environment loads as the
	// pod would see it.
	root := t.TempDir()
	container := dep.Spec.Template.Spec.Containers[0]
	var environ []string
	usage := config.Usage(config.ModeServe)
	for _, e := range container.Env {
		if !strings.Contains(usage, "env "+e.Name+",") {
			t.Errorf("the Deployment sets %s, which gpubroker serve does not read", e.Name)
		}
		v := e.Value
		for _, m := range container.VolumeMounts {
			if strings.HasPrefix(v, m.MountPath+"/") {
				content := "token\n"
				if e.Name == "GPUBROKER_PROFILES_FILE" {
					content = profiles.Data[filepath.Base(v)]
				}
				v = filepath.Join(root, v)
				if err := os.MkdirAll(filepath.Dir(v), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(v, []byte(content), 0o600); err != nil {
					t.Fatal(err)
				}
			}
		}
		environ = append(environ, e.Name+"="+v)
	}
	cfg, warnings, err := config.Load(config.ModeServe, nil, environ)
	if err != nil || len(warnings) > 0 {
		t.Fatalf("the Deployment's environment does not load: %v (warnings %q)", err, warnings)
	}
	if role.Namespace != cfg.Namespace {
		t.Errorf("the Role is in namespace %q, the broker's pods in %q", role.Namespace, cfg.Namespace)
	}
	if leader == nil || leader.Namespace != cfg.LeaderElectionNamespace || cfg.LeaderElectionNamespace == "" {
		t.Errorf("the reclaimer's Lease needs a Role in the leader-election namespace %q; got %+v", cfg.LeaderElectionNamespace, leader)
	} else if !slices.ContainsFunc(leader.Rules, func(r rbacv1.PolicyRule) bool {
		return slices.Contains(r.Resources, "leases") && slices.Contains(r.Verbs, "update") && slices.Contains(r.Verbs, "create")
	}) {
		t.Errorf("the leader Role does not grant create and update on leases")
	}

	if _, err := catalog.Parse([]byte(profiles.Data["profiles.yaml"])); err != nil {
		t.Errorf("the example profiles do not parse: %v", err)
	}

	need := map[string][]string{
		"pods":    {"get", "list", "watch", "create", "delete"},
		"secrets": {"get", "create", "update", "delete"},
	}
	for resource, verbs := range need {
		for _, verb := range verbs {
			granted := slices.ContainsFunc(role.Rules, func(r rbacv1.PolicyRule) bool {
				return slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, verb)
			})
			if !granted {
				t.Errorf("the Role does not grant %s on %s", verb, resource)
			}
		}
	}
}
