package harness

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	nodev1 "k8s.io/api/node/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"
)

// RuntimeClassName is the RuntimeClass the cluster offers for GPU pods; the
// RuntimeClass admission plugin refuses pods naming one that does not exist.
const RuntimeClassName = "nvidia"

// BrokerUser is the Kubernetes user the broker's kubeconfig authenticates as.
// Its rights come from the ClusterRole BrokerClusterRole.
const BrokerUser = "gpubroker"

// BrokerClusterRole is the ClusterRole bound to BrokerUser, with the rules
// of the broker's Role in the notebooks' namespace that the Helm chart
// ships (deploy/helm/gpubroker/files/rbac/broker-notebooks.yaml).
const BrokerClusterRole = "gpubroker-e2e"

// Cluster is a running etcd + kube-apiserver + kwok with admin and broker
// credentials. Its fields are read-only after StartCluster; its methods are
// safe for concurrent use.
type Cluster struct {
	// URL is the API server's base URL, https://127.0.0.1:<port>.
	URL string
	// CAFile is the PEM bundle that verifies the API server's serving cert.
	CAFile string
	// AdminKubeconfig and BrokerKubeconfig are kubeconfig files with token
	// auth: the first as a system:masters member, the second as BrokerUser.
	AdminKubeconfig  string
	BrokerKubeconfig string
	// Client is an admin clientset.
	Client kubernetes.Interface
	// RESTConfig is the admin REST config behind Client.
	RESTConfig *rest.Config
	// Dir holds data dirs, keys, kubeconfigs and the process logs.
	Dir string

	mu    sync.Mutex // guards procs against RestartAPIServer
	procs []*Process // in start order

	// What RestartAPIServer needs to start kube-apiserver again.
	apiBin, adminToken string
	// kwokArgs is kwok's binary and flags, for RestartAPIServer.
	kwokArgs []string
	apiArgs  []string
}

// StartCluster starts etcd, kube-apiserver and kwok under dir (which must
// exist and be private to this cluster), waits until the API server is ready
// and RBAC and the RuntimeClass are in place, and returns the cluster. On
// error everything started is stopped again and the error carries the log
// tails. The caller must call Stop.
func StartCluster(ctx context.Context, tools Tools, dir string) (_ *Cluster, err error) {
	c := &Cluster{Dir: dir}
	defer func() {
		if err != nil {
			logs := c.LogTails(40)
			_ = c.Stop()
			err = fmt.Errorf("%w\n%s", err, logs)
		}
	}()

	etcdURL, err := c.startEtcd(ctx, tools)
	if err != nil {
		return nil, err
	}
	adminToken, brokerToken := randomToken(), randomToken()
	if err := c.startAPIServer(ctx, tools, etcdURL, adminToken, brokerToken); err != nil {
		return nil, err
	}
	c.AdminKubeconfig = filepath.Join(dir, "admin.kubeconfig")
	c.BrokerKubeconfig = filepath.Join(dir, "gpubroker.kubeconfig")
	if err := writeKubeconfig(c.AdminKubeconfig, c.URL, c.CAFile, "admin", adminToken); err != nil {
		return nil, err
	}
	if err := writeKubeconfig(c.BrokerKubeconfig, c.URL, c.CAFile, BrokerUser, brokerToken); err != nil {
		return nil, err
	}
	c.RESTConfig = &rest.Config{
		Host:            c.URL,
		BearerToken:     adminToken,
		TLSClientConfig: rest.TLSClientConfig{CAFile: c.CAFile},
		QPS:             200,
		Burst:           400,
	}
	if c.Client, err = kubernetes.NewForConfig(c.RESTConfig); err != nil {
		return nil, fmt.Errorf("admin clientset: %w", err)
	}
	if err := c.bootstrap(ctx); err != nil {
		return nil, err
	}
	if err := c.startKwok(tools); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Cluster) startEtcd(ctx context.Context, tools Tools) (string, error) {
	clientPort, err := FreePort()
	if err != nil {
		return "", err
	}
	peerPort, err := FreePort()
	if err != nil {
		return "", err
	}
	clientURL := fmt.Sprintf("http://127.0.0.1:%d", clientPort)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peerPort)
	p, err := StartProcess("etcd", filepath.Join(c.Dir, "etcd.log"), os.Environ(), tools.Etcd,
		"--name=e2e",
		"--data-dir="+filepath.Join(c.Dir, "etcd-data"),
		"--listen-client-urls="+clientURL,
		"--advertise-client-urls="+clientURL,
		"--listen-peer-urls="+peerURL,
		"--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=e2e="+peerURL,
		"--log-level=warn",
		"--unsafe-no-fsync", // test data; fsync only slows the shared disk
	)
	if err != nil {
		return "", err
	}
	c.procs = append(c.procs, p)
	hc := &http.Client{Timeout: 2 * time.Second}
	err = Poll(ctx, 100*time.Millisecond, 30*time.Second, func(ctx context.Context) (bool, string, error) {
		select {
		case <-p.Exited():
			return false, "", fmt.Errorf("etcd exited: %w", p.ExitErr())
		default:
		}
		body, status, err := get(ctx, hc, clientURL+"/health", "")
		if err != nil {
			return false, err.Error(), nil
		}
		return status == http.StatusOK && strings.Contains(body, `"health":"true"`), body, nil
	})
	if err != nil {
		return "", fmt.Errorf("etcd not healthy: %w", err)
	}
	return clientURL, nil
}

func (c *Cluster) startAPIServer(ctx context.Context, tools Tools, etcdURL, adminToken, brokerToken string) error {
	port, err := FreePort()
	if err != nil {
		return err
	}
	keyFile := filepath.Join(c.Dir, "sa.key")
	if err := writeRSAKey(keyFile); err != nil {
		return err
	}
	tokenFile := filepath.Join(c.Dir, "tokens.csv")
	tokens := fmt.Sprintf("%s,admin,admin-uid,\"system:masters\"\n%s,%s,%s-uid\n", adminToken, brokerToken, BrokerUser, BrokerUser)
	if err := os.WriteFile(tokenFile, []byte(tokens), 0o600); err != nil {
		return fmt.Errorf("write token file: %w", err)
	}
	certDir := filepath.Join(c.Dir, "apiserver-certs")
	c.apiBin, c.adminToken = tools.KubeAPIServer, adminToken
	c.apiArgs = []string{
		"--etcd-servers=" + etcdURL,
		fmt.Sprintf("--secure-port=%d", port),
		"--bind-address=127.0.0.1",
		"--endpoint-reconciler-type=none", // no kubernetes Service endpoints on loopback
		"--cert-dir=" + certDir,
		"--token-auth-file=" + tokenFile,
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + keyFile,
		"--service-account-signing-key-file=" + keyFile,
		"--service-cluster-ip-range=10.96.0.0/16",
		"--enable-priority-and-fairness=false",
		// /debug/pprof, for the admin only (system:masters; RBAC grants
		// the broker no non-resource URLs): the scale rig's -scale-pprof
		// reads it. Nothing is sampled until someone asks.
		"--profiling=true",
		"--v=1",
	}
	c.URL = fmt.Sprintf("https://127.0.0.1:%d", port)
	// The serving cert is self-signed at start; apiserver.crt holds the cert
	// and the CA that signed it.
	c.CAFile = filepath.Join(certDir, "apiserver.crt")
	p, err := c.runAPIServer(ctx)
	if err != nil {
		return err
	}
	c.procs = append(c.procs, p)
	return nil
}

// runAPIServer starts kube-apiserver with the saved arguments and waits up
// to 90 s for /readyz and its serving cert; on failure the process is
// stopped.
func (c *Cluster) runAPIServer(ctx context.Context) (*Process, error) {
	p, err := StartProcess("kube-apiserver", filepath.Join(c.Dir, "kube-apiserver.log"), os.Environ(), c.apiBin, c.apiArgs...)
	if err != nil {
		return nil, err
	}
	// Until the serving cert exists, probe without verification.
	insecure := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // probe only, until the cert exists
	}}
	defer insecure.CloseIdleConnections()
	err = Poll(ctx, 200*time.Millisecond, 90*time.Second, func(ctx context.Context) (bool, string, error) {
		select {
		case <-p.Exited():
			return false, "", fmt.Errorf("kube-apiserver exited: %w", p.ExitErr())
		default:
		}
		body, status, err := get(ctx, insecure, c.URL+"/readyz", c.adminToken)
		if err != nil {
			return false, err.Error(), nil
		}
		return status == http.StatusOK, fmt.Sprintf("%d %s", status, lastLines(body, 5)), nil
	})
	if err == nil {
		_, err = os.Stat(c.CAFile)
	}
	if err != nil {
		_ = p.Kill()
		return nil, fmt.Errorf("kube-apiserver not ready: %w", err)
	}
	return p, nil
}

// RestartAPIServer stops kube-apiserver (SIGTERM, 5 s grace, then SIGKILL)
// and starts it again with the same flags, port, certificates and etcd, so
// every client reconnects to the same URL; it returns once /readyz answers
// 200. Watches break meanwhile, as in a control-plane upgrade. kwok is
// restarted after it: kwok 0.8's pod controller does not always resume
// after its watch broke (pods then stay as they were, seen in the chaos
// soak), where real kubelets reconnect.
func (c *Cluster) RestartAPIServer(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := slices.IndexFunc(c.procs, func(p *Process) bool { return p.Name == "kube-apiserver" })
	if i < 0 {
		return errors.New("restart kube-apiserver: it is not running")
	}
	_ = c.procs[i].Stop(5 * time.Second) // a killed server exits non-zero; that is the point
	np, err := c.runAPIServer(ctx)
	if err != nil {
		c.procs = slices.Delete(c.procs, i, i+1)
		return fmt.Errorf("restart kube-apiserver: %w\n%s", err, TailFile(filepath.Join(c.Dir, "kube-apiserver.log"), 40))
	}
	c.procs[i] = np
	k := slices.IndexFunc(c.procs, func(p *Process) bool { return p.Name == "kwok" })
	if k < 0 || c.kwokArgs == nil {
		return nil
	}
	_ = c.procs[k].Stop(5 * time.Second)
	kp, err := StartProcess("kwok", filepath.Join(c.Dir, "kwok.log"), os.Environ(), c.kwokArgs[0], c.kwokArgs[1:]...)
	if err != nil {
		c.procs = slices.Delete(c.procs, k, k+1)
		return fmt.Errorf("restart kwok after kube-apiserver: %w", err)
	}
	c.procs[k] = kp
	return nil
}

// Pids is the process id of each process of the cluster by name (etcd,
// kube-apiserver, kwok), as they run now (a restart changes one).
func (c *Cluster) Pids() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.procs))
	for _, p := range c.procs {
		out[p.Name] = p.Pid()
	}
	return out
}

// bootstrap creates what a real cluster's controllers or installers would:
// the broker's RBAC and the RuntimeClass. The broker gets exactly the rules
// of the Role that the chart ships for the notebooks' namespace (as a
// ClusterRole, since every test has its own namespace), so the e2e tests
// prove those rules are enough.
func (c *Cluster) bootstrap(ctx context.Context) error {
	rules, err := deployRules()
	if err != nil {
		return err
	}
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: BrokerClusterRole},
		Rules:      rules,
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: BrokerClusterRole},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: BrokerClusterRole},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: BrokerUser}},
	}
	rc := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: RuntimeClassName}, Handler: RuntimeClassName}
	if _, err := c.Client.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create cluster role: %w", err)
	}
	if _, err := c.Client.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create cluster role binding: %w", err)
	}
	if _, err := c.Client.NodeV1().RuntimeClasses().Create(ctx, rc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create runtime class: %w", err)
	}
	return nil
}

func (c *Cluster) startKwok(tools Tools) error {
	c.kwokArgs = []string{tools.Kwok,
		"--kubeconfig=" + c.AdminKubeconfig,
		"--config=" + tools.KwokStages,
		"--manage-all-nodes=false",
		"--manage-nodes-with-annotation-selector=" + KwokNodeAnnotation + "=fake",
		"--cidr=10.244.0.0/16",
		"--node-ip=10.1.0.1",
	}
	p, err := StartProcess("kwok", filepath.Join(c.Dir, "kwok.log"), os.Environ(), c.kwokArgs[0], c.kwokArgs[1:]...)
	if err != nil {
		return err
	}
	c.procs = append(c.procs, p)
	return nil // readiness shows in NewNodes, which waits for Ready nodes
}

// Stop stops kwok, kube-apiserver and etcd, in that order (each SIGTERM, 10 s
// grace, SIGKILL). It returns every failure joined.
func (c *Cluster) Stop() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for i := len(c.procs) - 1; i >= 0; i-- {
		if err := c.procs[i].Stop(10 * time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	c.procs = nil
	return errors.Join(errs...)
}

// LogTails returns the last n lines of each process's log, labelled.
func (c *Cluster) LogTails(n int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var b strings.Builder
	for _, p := range c.procs {
		fmt.Fprintf(&b, "--- %s (%s), last %d lines:\n%s\n", p.Name, p.LogPath, n, p.LogTail(n))
	}
	return b.String()
}

func writeRSAKey(path string) error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return fmt.Errorf("service account key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("service account key: %w", err)
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return fmt.Errorf("service account key: %w", err)
	}
	return nil
}

func writeKubeconfig(path, server, caFile, user, token string) error {
	// JSON is valid YAML; the kubeconfig loader reads both.
	cfg := fmt.Sprintf(`{
  "apiVersion": "v1",
  "kind": "Config",
  "clusters": [{"name": "e2e", "cluster": {"server": %q, "certificate-authority": %q}}],
  "users": [{"name": %q, "user": {"token": %q}}],
  "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": %q}}],
  "current-context": "e2e"
}
`, server, caFile, user, token, user)
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		return fmt.Errorf("write kubeconfig: %w", err)
	}
	return nil
}

func randomToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on Linux
	return hex.EncodeToString(b)
}

// get performs a GET with an optional bearer token and returns the body (at
// most 64 KiB) and status.
func get(ctx context.Context, hc *http.Client, url, token string) (string, int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", 0, fmt.Errorf("get %s: %w", url, err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return "", 0, fmt.Errorf("get %s: %w", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return "", resp.StatusCode, fmt.Errorf("get %s: read body: %w", url, err)
	}
	return string(b), resp.StatusCode, nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// deployRules reads the rules of the broker's Role in the notebooks'
// namespace from the chart's file (a YAML list of PolicyRules), found
// relative to this source file.
func deployRules() ([]rbacv1.PolicyRule, error) {
	_, self, _, ok := runtime.Caller(0)
	if !ok {
		return nil, errors.New("deploy rbac: cannot locate the harness source")
	}
	path := filepath.Join(filepath.Dir(self), "..", "..", "deploy", "helm", "gpubroker", "files", "rbac", "broker-notebooks.yaml")
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("deploy rbac: %w", err)
	}
	var rules []rbacv1.PolicyRule
	if err := yaml.UnmarshalStrict(data, &rules); err != nil {
		return nil, fmt.Errorf("deploy rbac %s: %w", path, err)
	}
	if len(rules) == 0 {
		return nil, fmt.Errorf("deploy rbac %s: no rules", path)
	}
	return rules, nil
}

// ServiceAccountKubeconfig writes to path a kubeconfig that authenticates
// as the ServiceAccount namespace/name with a token from the TokenRequest
// API (valid for an hour, bound to the account), the way a pod of that
// account reaches the API server: a process started with it has exactly
// the account's rights. The account must exist.
func (c *Cluster) ServiceAccountKubeconfig(ctx context.Context, namespace, name, path string) error {
	hour := int64(3600)
	tr, err := c.Client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &hour},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("token for service account %s/%s: %w", namespace, name, err)
	}
	return writeKubeconfig(path, c.URL, c.CAFile, "system:serviceaccount:"+namespace+":"+name, tr.Status.Token)
}
