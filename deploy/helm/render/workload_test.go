package render

import (
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/yaml"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/spawner"
)

// TestInstallHookInitContainer runs the agent's init container command
// with /bin/sh (as the agent image has it) against a temporary host root:
// it leaves the hook library and an ld.so.preload naming the path where
// notebook pods mount it, readable by everyone, and nothing half-written;
// a second run replaces both in place.
func TestInstallHookInitContainer(t *testing.T) {
	r, err := RenderExample("minimal")
	if err != nil {
		t.Fatal(err)
	}
	ds, err := r.DaemonSet("agent")
	if err != nil {
		t.Fatal(err)
	}
	ic := ds.Spec.Template.Spec.InitContainers[0]
	env := envOf(ic)
	if env["POD_HOOK_LIBRARY"] != v1.PodHookLib {
		t.Errorf("ld.so.preload would name %q; notebook pods mount the hook at %q", env["POD_HOOK_LIBRARY"], v1.PodHookLib)
	}
	if want := path.Join(r.Values["hostRoot"].(string), v1.HostHookSubdir); env["HOOK_DIR"] != want {
		t.Errorf("hook installed into %q; the spawner mounts %q", env["HOOK_DIR"], want)
	}

	root := t.TempDir()
	source := filepath.Join(root, "image", "libgpulimit.so")
	hookDir := filepath.Join(root, "host", env["HOOK_DIR"])
	for i, content := range []string{"\x7fELF first build", "\x7fELF second build"} {
		if err := os.MkdirAll(filepath.Dir(source), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(source, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(ic.Command[0], ic.Command[1:]...)
		cmd.Env = []string{"PATH=/usr/bin:/bin", "HOOK_SOURCE=" + source, "HOOK_DIR=" + hookDir, "POD_HOOK_LIBRARY=" + env["POD_HOOK_LIBRARY"]}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("run %d: %v\n%s", i, err, out)
		}
		entries, err := os.ReadDir(hookDir)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
			fi, err := e.Info()
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != 0o644 {
				t.Errorf("run %d: %s has mode %v, want 0644 (notebook users read it)", i, e.Name(), fi.Mode().Perm())
			}
		}
		if !slices.Equal(names, []string{"ld.so.preload", "libgpulimit.so"}) {
			t.Errorf("run %d: hook directory holds %v, want only ld.so.preload and libgpulimit.so", i, names)
		}
		if b, _ := os.ReadFile(filepath.Join(hookDir, "libgpulimit.so")); string(b) != content {
			t.Errorf("run %d: installed library %q, want the image's %q", i, b, content)
		}
		if b, _ := os.ReadFile(filepath.Join(hookDir, "ld.so.preload")); string(b) != v1.PodHookLib+"\n" {
			t.Errorf("run %d: ld.so.preload %q, want %q", i, b, v1.PodHookLib+"\n")
		}
	}
}

// TestJupyterHubValuesMatchTheChart keeps deploy/jupyterhub/values.yaml
// (the Zero to JupyterHub values) true to the chart as examples/jupyterhub.yaml
// installs it: the hub reaches the broker's Service, both sides read the
// same token Secret, the notebooks reach the hub, and the hub's proxy and
// hub reach the notebooks through both NetworkPolicies.
func TestJupyterHubValuesMatchTheChart(t *testing.T) {
	r, err := RenderExample("jupyterhub")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(Dir(), "..", "..", "jupyterhub", "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var z2jh struct {
		Hub struct {
			Config struct {
				GPUBrokerSpawner struct {
					BrokerURL    string `json:"broker_url"`
					HubTokenFile string `json:"hub_token_file"`
				} `json:"GPUBrokerSpawner"`
				Spawner struct {
					HubConnectURL string `json:"hub_connect_url"`
				} `json:"Spawner"`
			} `json:"config"`
			ExtraVolumes      []corev1.Volume      `json:"extraVolumes"`
			ExtraVolumeMounts []corev1.VolumeMount `json:"extraVolumeMounts"`
			NetworkPolicy     struct {
				Ingress []networkingv1.NetworkPolicyIngressRule `json:"ingress"`
				Egress  []networkingv1.NetworkPolicyEgressRule  `json:"egress"`
			} `json:"networkPolicy"`
		} `json:"hub"`
		Proxy struct {
			CHP struct {
				NetworkPolicy struct {
					Egress []networkingv1.NetworkPolicyEgressRule `json:"egress"`
				} `json:"networkPolicy"`
			} `json:"chp"`
		} `json:"proxy"`
	}
	if err := yaml.Unmarshal(b, &z2jh); err != nil {
		t.Fatal(err)
	}
	v := values{r.Values}
	dep, err := r.Deployment("broker")
	if err != nil {
		t.Fatal(err)
	}
	brokerPods := dep.Spec.Template.Labels
	var svc corev1.Service
	if err := Decode(r.Find("Service", "gpubroker"), &svc); err != nil {
		t.Fatal(err)
	}
	httpPort := dep.Spec.Template.Spec.Containers[0].Ports[0]
	if httpPort.Name != "http" {
		t.Fatalf("the broker's first port is %s, want http", httpPort.Name)
	}

	u, err := url.Parse(z2jh.Hub.Config.GPUBrokerSpawner.BrokerURL)
	if err != nil {
		t.Fatal(err)
	}
	if want := svc.Name + "." + svc.Namespace + ".svc.cluster.local"; u.Hostname() != want {
		t.Errorf("broker_url host %s, want the broker's Service %s", u.Hostname(), want)
	}
	if port := u.Port(); port != "" && port != strconv.Itoa(int(svc.Spec.Ports[0].Port)) || port == "" && svc.Spec.Ports[0].Port != 80 {
		t.Errorf("broker_url %s does not reach the Service port %d", u, svc.Spec.Ports[0].Port)
	}

	(func() {
		egress := z2jh.Hub.NetworkPolicy.Egress
		if len(egress) != 1 || len(egress[0].To) != 1 || len(egress[0].Ports) != 1 {
			t.Errorf("hub egress %+v: want one rule to the broker", egress)
			return
		}
		to := egress[0].To[0]
		if to.NamespaceSelector.MatchLabels[corev1.LabelMetadataName] != dep.Namespace || !selects(to.PodSelector, brokerPods) {
			t.Errorf("hub egress to %+v does not reach the broker's pods in %s", to, dep.Namespace)
		}
		if egress[0].Ports[0].Port.IntValue() != int(httpPort.ContainerPort) {
			t.Errorf("hub egress port %v, the broker listens on %d", egress[0].Ports[0].Port, httpPort.ContainerPort)
		}
	})()

	tokenFile := z2jh.Hub.Config.GPUBrokerSpawner.HubTokenFile
	mount := slices.IndexFunc(z2jh.Hub.ExtraVolumeMounts, func(m corev1.VolumeMount) bool { return strings.HasPrefix(tokenFile, m.MountPath+"/") })
	if mount < 0 {
		t.Fatalf("hub_token_file %s is in no hub.extraVolumeMounts", tokenFile)
	}
	vol := slices.IndexFunc(z2jh.Hub.ExtraVolumes, func(vol corev1.Volume) bool { return vol.Name == z2jh.Hub.ExtraVolumeMounts[mount].Name })
	if vol < 0 || z2jh.Hub.ExtraVolumes[vol].Secret == nil {
		t.Fatalf("hub_token_file's volume is not a Secret")
	}
	if got, want := z2jh.Hub.ExtraVolumes[vol].Secret.SecretName, v.s("broker.hub.token.name"); got != want {
		t.Errorf("the hub reads its token from Secret %s, the broker from %s", got, want)
	}
	if got, want := path.Base(tokenFile), v.s("broker.hub.token.key"); got != want {
		t.Errorf("the hub reads key %s of the token Secret, the broker key %s", got, want)
	}

	nbNS := v.s("notebooks.namespace")
	connect, err := url.Parse(z2jh.Hub.Config.Spawner.HubConnectURL)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(connect.Hostname(), "."+v.s("jupyterhub.namespace")+".svc.cluster.local") {
		t.Errorf("hub_connect_url %s: a short name does not resolve from the notebooks' namespace %s", connect, nbNS)
	}
	hubURL, _ := url.Parse(v.s("broker.hub.url"))
	if hubURL == nil || hubURL.Host != connect.Host {
		t.Errorf("the broker posts activity to %s, the notebooks reach the hub at %s", v.s("broker.hub.url"), connect.Host)
	}
	var fromNotebooks, fromBroker bool
	for _, rule := range z2jh.Hub.NetworkPolicy.Ingress {
		if len(rule.Ports) != 1 || strconv.Itoa(rule.Ports[0].Port.IntValue()) != connect.Port() {
			continue
		}
		for _, p := range rule.From {
			switch p.NamespaceSelector.MatchLabels[corev1.LabelMetadataName] {
			case nbNS:
				fromNotebooks = fromNotebooks || selects(p.PodSelector, map[string]string{v1.LabelManagedBy: v1.ManagedByValue})
			case dep.Namespace:
				fromBroker = fromBroker || selects(p.PodSelector, brokerPods)
			}
		}
	}
	if !fromNotebooks || !fromBroker {
		t.Errorf("the hub's ingress lets in the notebooks %v and the broker %v on port %s; want both", fromNotebooks, fromBroker, connect.Port())
	}

	proxy := z2jh.Proxy.CHP.NetworkPolicy.Egress
	if len(proxy) != 1 || len(proxy[0].To) != 1 || len(proxy[0].Ports) != 1 ||
		proxy[0].To[0].NamespaceSelector.MatchLabels[corev1.LabelMetadataName] != nbNS ||
		!selects(proxy[0].To[0].PodSelector, map[string]string{v1.LabelManagedBy: v1.ManagedByValue}) ||
		proxy[0].Ports[0].Port.IntValue() != spawner.DefaultNotebookPort {
		t.Errorf("the proxy's egress %+v does not reach the notebook pods in %s on port %d", proxy, nbNS, spawner.DefaultNotebookPort)
	}
	var np networkingv1.NetworkPolicy
	if err := Decode(r.Find("NetworkPolicy", "gpubroker-notebooks"), &np); err != nil {
		t.Fatal(err)
	}
	for _, component := range []string{"proxy", "hub"} {
		if !slices.ContainsFunc(np.Spec.Ingress[0].From, func(p networkingv1.NetworkPolicyPeer) bool {
			return p.NamespaceSelector.MatchLabels[corev1.LabelMetadataName] == v.s("jupyterhub.namespace") &&
				selects(p.PodSelector, map[string]string{"component": component, "app": "jupyterhub"})
		}) {
			t.Errorf("the notebooks' NetworkPolicy does not let in JupyterHub's %s pods", component)
		}
	}
}
