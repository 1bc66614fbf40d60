package e2e

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/devissuer"
	"github.com/gpubroker/gpubroker/broker/redistest"
	"github.com/gpubroker/gpubroker/e2e/harness"
	"github.com/gpubroker/gpubroker/spawner/runner"
)

const (
	// audience is the OIDC audience the brokers under test accept.
	audience = "gpubroker"
	// adminGroup is the group claim value that makes a caller an admin.
	adminGroup = "gpubroker-admins"
	// gpuMemoryMiB and gpuSMs describe every simulated GPU: an H100 80GB.
	gpuMemoryMiB = 81559
	gpuSMs       = 132
	gpuModel     = "NVIDIA H100 80GB HBM3"
	// notebookPort is the port the broker puts into a running server's URL.
	notebookPort = 8888
)

// testProfiles is the catalog of every test broker. small: 10 per GPU by
// compute; medium: 3 per GPU by memory (3 × 24576 = 73728 ≤ 81559 < 4 ×
// 24576); each user may hold 2 servers.
const testProfiles = `
profiles:
  - name: small
    displayName: Small
    image: example.invalid/notebook:1
    cpu: "1"
    memory: 1Gi
    slice: {memoryMiB: 8192, computePercent: 10, computeLimitPercent: 50}
  - name: medium
    displayName: Medium
    image: example.invalid/notebook:1
    cpu: "2"
    memory: 2Gi
    slice: {memoryMiB: 24576, computePercent: 25, computeLimitPercent: 75}
quotas:
  defaultUser: {servers: 2}
`

// env is one test's world: a namespace with kwok nodes in the shared cluster,
// its own redis-server, OIDC issuer and gpubroker process, and the GPUs it
// registered.
type env struct {
	t       testing.TB
	cluster *harness.Cluster
	ns      string
	nodes   []string
	gpus    []v1.GPU
	redis   *redistest.Server // nil with envOptions.redis
	issuer  *devissuer.Issuer
	broker  *harness.Broker
	// admin calls the API as a member of adminGroup.
	admin *harness.Client
	// hubToken is the JupyterHub service token the broker accepts.
	hubToken string
	// bin, profiles and redisOpts (its Redis fields) start more brokers.
	bin, profiles string
	redisOpts     harness.BrokerOptions
	// leaseArgs are added to every broker with envOptions.leaderElection.
	leaseArgs []string
	// kubeconfig is the brokers' kubeconfig; "" means the cluster's
	// broker kubeconfig.
	kubeconfig string
	// runner runs the pods of its nodes as local processes (envOptions
	// notebooks); nil when kwok runs them.
	runner *runner.Runner
	// hook is the runner nodes' hook directory (nil without a runner).
	hook *nodeHook
}

// envOptions size an env. Zero values take the defaults.
type envOptions struct {
	nodes       int // default 1
	gpusPerNode int // default 1
	// profiles replaces testProfiles as the broker's catalog when set.
	profiles string
	// brokerArgs are more gpubroker serve flags.
	brokerArgs []string
	// leaderElection runs the brokers' reclaimer under a Lease in the
	// env's namespace (--leader-election-namespace), with the Role the
	// chart gives the broker for it.
	leaderElection bool
	// redis, when set, names the Redis of the env's brokers (its Redis
	// fields: a Sentinel setup); default a redis-server of the env's own.
	redis *harness.BrokerOptions
	// notebooks puts the env's nodes under a pod runner instead of kwok:
	// pods run as real processes (the default profiles are then
	// notebookProfiles).
	notebooks bool
}

// newEnv builds an env for t: namespace, nodes, redis-server, issuer, a
// running broker (stopped when t ends; its log is printed if t failed) and
// the GPUs registered through the admin API.
func newEnv(t testing.TB, o envOptions) *env {
	t.Helper()
	c := needCluster(t)
	if o.nodes == 0 {
		o.nodes = 1
	}
	if o.gpusPerNode == 0 {
		o.gpusPerNode = 1
	}
	if o.profiles == "" {
		o.profiles = testProfiles
		if o.notebooks {
			o.profiles = notebookProfiles
		}
	}
	bin := brokerBinary(t)
	e := &env{t: t, cluster: c}
	e.ns = newNamespace(t, c)
	if o.notebooks {
		e.runner, e.nodes, e.hook = newRunnerNodes(t, c, e.ns, o.nodes)
	} else {
		e.nodes = newNodes(t, c, o.nodes)
	}
	for ni, node := range e.nodes {
		for gi := range o.gpusPerNode {
			e.gpus = append(e.gpus, v1.GPU{
				UUID:      fmt.Sprintf("GPU-%s-%d-%d", e.ns, ni, gi),
				Node:      node,
				Model:     gpuModel,
				MemoryMiB: gpuMemoryMiB,
				SMCount:   gpuSMs,
				Healthy:   true,
			})
		}
	}
	e.issuer = devissuer.StartTest(t)

	e.hubToken = "hub-" + harness.UniqueName("token")
	e.bin, e.profiles = bin, o.profiles
	if o.redis != nil {
		e.redisOpts = *o.redis
	} else {
		e.redis = redistest.Start(t)
		e.redisOpts = harness.BrokerOptions{RedisURL: e.redis.URL()}
	}
	if o.leaderElection {
		e.allowLeases()
		e.leaseArgs = []string{"--leader-election-namespace=" + e.ns}
	}
	e.broker = e.startBroker(o.brokerArgs...)
	e.admin = e.client("admin", adminGroup)
	e.registerGPUs()
	if !o.leaderElection {
		e.waitFirstPass(e.broker)
	}
	return e
}

// waitFirstPass waits until b has made its first reconcile pass, which on
// a fresh install opens placement: /readyz answers before it, and a create
// in between is a 503 ("rebuilding"), a correct answer that tests starting
// with a create would have to retry. A replica under leader election that
// does not lead makes no pass at start, so it is not for those.
func (e *env) waitFirstPass(b *harness.Broker) {
	e.t.Helper()
	err := harness.Poll(e.t.Context(), 20*time.Millisecond, 30*time.Second, func(ctx context.Context) (bool, string, error) {
		m, err := b.Scrape(ctx)
		if err != nil {
			return false, err.Error(), nil
		}
		n := m[`gpubroker_reconcile_passes_total{result="ok"}`] + m[`gpubroker_reconcile_passes_total{result="error"}`]
		return n >= 1, fmt.Sprintf("%v passes", n), nil
	})
	if err != nil {
		e.t.Fatalf("broker's first reconcile pass: %v", err)
	}
}

// startBroker starts one more gpubroker serve of the env (on its Redis,
// namespace and issuer, with args appended), stopped when the test ends
// (its log printed if the test failed).
func (e *env) startBroker(args ...string) *harness.Broker {
	e.t.Helper()
	return e.startBrokerBinary(e.bin, args...)
}

// startBrokerBinary is startBroker with the gpubroker binary at bin.
func (e *env) startBrokerBinary(bin string, args ...string) *harness.Broker {
	t := e.t
	t.Helper()
	start := time.Now()
	o := e.redisOpts
	o.Binary, o.Dir = bin, t.TempDir()
	o.Kubeconfig, o.Namespace = cmp.Or(e.kubeconfig, e.cluster.BrokerKubeconfig), e.ns
	o.IssuerURL, o.Audience = e.issuer.URL(), audience
	o.ProfilesYAML, o.HubToken = e.profiles, e.hubToken
	o.ReconcileInterval, o.OrphanGrace = time.Second, 2*time.Second
	o.Args = append(slices.Clone(e.leaseArgs), args...)
	b, err := harness.StartBroker(t.Context(), o)
	if err != nil {
		t.Fatalf("start broker: %v", err)
	}
	t.Logf("broker ready in %s at %s (namespace %s)", time.Since(start).Round(time.Millisecond), b.URL, e.ns)
	t.Cleanup(func() {
		if err := b.Stop(); err != nil {
			t.Errorf("stop broker: %v", err)
		}
		if t.Failed() {
			t.Logf("--- %s, last 80 lines:\n%s", b.LogPath, b.LogTail(80))
			keepLog(t, b.LogPath)
		}
	})
	return b
}

// keepLog keeps a log of a failed test in $E2E_ARTIFACTS, because
// t.TempDir is removed when the test ends.
func keepLog(t testing.TB, path string) {
	if err := keepArtifact(path, harness.UniqueName(t.Name())+"-"+filepath.Base(path)); err != nil {
		t.Logf("keep log: %v", err)
	}
}

// keepArtifact copies the file at path to $E2E_ARTIFACTS/name; it does
// nothing when E2E_ARTIFACTS is unset.
func keepArtifact(path, name string) error {
	dir := os.Getenv("E2E_ARTIFACTS")
	if dir == "" {
		return nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("keep %s: %w", path, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("keep %s: %w", path, err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
		return fmt.Errorf("keep %s: %w", path, err)
	}
	return nil
}

// token mints a valid token for user in groups.
func (e *env) token(user string, groups ...string) string {
	e.t.Helper()
	tok, err := e.issuer.Mint(devissuer.Claims{Subject: "sub-" + user, Username: user, Groups: groups, Audience: audience})
	if err != nil {
		e.t.Fatalf("mint token for %s: %v", user, err)
	}
	return tok
}

// client returns an API client acting as user in groups.
func (e *env) client(user string, groups ...string) *harness.Client {
	e.t.Helper()
	return &harness.Client{BaseURL: e.broker.URL, Token: e.token(user, groups...)}
}

// registerGPUs (re-)registers every GPU of the env, as the node agents do.
func (e *env) registerGPUs() {
	e.t.Helper()
	for _, g := range e.gpus {
		if err := e.admin.PutGPU(e.t.Context(), g); err != nil {
			e.t.Fatalf("register GPU %s: %v", g.UUID, err)
		}
	}
}

// pods lists the broker's pods in the env's namespace.
func (e *env) pods(ctx context.Context) ([]corev1.Pod, error) {
	l, err := e.cluster.Client.CoreV1().Pods(e.ns).List(ctx, metav1.ListOptions{
		LabelSelector: v1.LabelManagedBy + "=" + v1.ManagedByValue,
	})
	if err != nil {
		return nil, fmt.Errorf("list pods in %s: %w", e.ns, err)
	}
	return l.Items, nil
}

// allowLeases gives the broker's user what the reclaimer's election needs
// in the env's namespace: get, create and update on leases (the rules of
// the broker's leader Role in the deploy manifests).
func (e *env) allowLeases() {
	e.t.Helper()
	ctx := e.t.Context()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "gpubroker-leader", Namespace: e.ns},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "create", "update"}}}}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "gpubroker-leader", Namespace: e.ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: harness.BrokerUser}}}
	if _, err := e.cluster.Client.RbacV1().Roles(e.ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("create lease role: %v", err)
	}
	if _, err := e.cluster.Client.RbacV1().RoleBindings(e.ns).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("create lease role binding: %v", err)
	}
}

// newNamespace creates a namespace for t (with its default ServiceAccount)
// and deletes its pods, secrets and itself when t ends.
func newNamespace(t testing.TB, c *harness.Cluster) string {
	t.Helper()
	ns := harness.UniqueName(t.Name())
	if err := c.CreateNamespace(t.Context(), ns); err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), 30*time.Second)
		defer cancel()
		if err := c.DeleteNamespace(ctx, ns); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return ns
}

// newNodes creates n Ready kwok nodes for t, deleted when t ends.
func newNodes(t testing.TB, c *harness.Cluster, n int) []string {
	t.Helper()
	base := harness.UniqueName(t.Name())
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s-gpu-%d", base, i)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), 30*time.Second)
		defer cancel()
		if err := c.DeleteNodes(ctx, names...); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	if err := c.CreateNodes(t.Context(), names...); err != nil {
		t.Fatalf("%v", err)
	}
	return names
}
