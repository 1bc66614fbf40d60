package harness

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// KwokNodeAnnotation marks the Nodes kwok manages (value "fake").
const KwokNodeAnnotation = "kwok.x-k8s.io/node"

var nonDNS = regexp.MustCompile(`[^a-z0-9-]+`)

// UniqueName returns a DNS-1123 label (at most 40 characters) built from
// base, made unique with a random suffix; used for namespaces, nodes and
// user names in tests.
func UniqueName(base string) string {
	s := nonDNS.ReplaceAllString(strings.ToLower(base), "-")
	s = strings.Trim(s, "-")
	if len(s) > 30 {
		sum := sha256.Sum256([]byte(s))
		s = strings.Trim(s[:23], "-") + "-" + hex.EncodeToString(sum[:])[:6]
	}
	if s == "" {
		s = "x"
	}
	return s + "-" + randomToken()[:8]
}

// CreateNamespace creates a namespace named name and, because no controller
// manager runs, its "default" ServiceAccount (ServiceAccount admission
// refuses pods without it).
func (c *Cluster) CreateNamespace(ctx context.Context, name string) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"gpubroker.io/e2e": "true"}}}
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create namespace %s: %w", name, err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: name}}
	if _, err := c.Client.CoreV1().ServiceAccounts(name).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create service account %s/default: %w", name, err)
	}
	return nil
}

// DeleteNamespace deletes the pods and secrets in the namespace at once
// (grace period 0) and then the namespace itself. Without a namespace
// controller the namespace stays Terminating; that is harmless.
func (c *Cluster) DeleteNamespace(ctx context.Context, name string) error {
	zero := int64(0)
	opts := metav1.DeleteOptions{GracePeriodSeconds: &zero}
	if err := c.Client.CoreV1().Pods(name).DeleteCollection(ctx, opts, metav1.ListOptions{}); err != nil {
		return fmt.Errorf("delete pods in %s: %w", name, err)
	}
	if err := c.Client.CoreV1().Secrets(name).DeleteCollection(ctx, opts, metav1.ListOptions{}); err != nil {
		return fmt.Errorf("delete secrets in %s: %w", name, err)
	}
	if err := c.Client.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete namespace %s: %w", name, err)
	}
	return nil
}

// CreateNodes creates one kwok-managed Node per name (no taints, so pods
// pinned with spec.nodeName run there) and waits up to 30 s until kwok
// reports every one Ready.
func (c *Cluster) CreateNodes(ctx context.Context, names ...string) error {
	for _, name := range names {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Annotations: map[string]string{KwokNodeAnnotation: "fake"},
			Labels:      map[string]string{"type": "kwok", "kubernetes.io/hostname": name, "gpubroker.io/e2e": "true"},
		}}
		if _, err := c.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create node %s: %w", name, err)
		}
	}
	for _, name := range names {
		err := Poll(ctx, 100*time.Millisecond, 30*time.Second, func(ctx context.Context) (bool, string, error) {
			n, err := c.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error(), nil
			}
			for _, cond := range n.Status.Conditions {
				if cond.Type == corev1.NodeReady {
					return cond.Status == corev1.ConditionTrue, "Ready=" + string(cond.Status), nil
				}
			}
			return false, "no Ready condition", nil
		})
		if err != nil {
			return fmt.Errorf("node %s not ready (is kwok running?): %w", name, err)
		}
	}
	return nil
}

// DeleteNodes deletes the named Nodes; missing ones are ignored.
func (c *Cluster) DeleteNodes(ctx context.Context, names ...string) error {
	for _, name := range names {
		if err := c.Client.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete node %s: %w", name, err)
		}
	}
	return nil
}
