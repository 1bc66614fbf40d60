package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gpubroker/gpubroker/e2e/harness"
)

// newNamespace creates a namespace for t (with its default ServiceAccount)
// and deletes its pods, secrets and itself when t ends.
func newNamespace(t *testing.T, c *harness.Cluster) string {
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
func newNodes(t *testing.T, c *harness.Cluster, n int) []string {
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
