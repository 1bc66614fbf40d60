package app

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpubroker/gpubroker/broker/internal/config"
	"github.com/gpubroker/gpubroker/broker/internal/httpapi"
)

// lockedBuffer is a bytes.Buffer safe for the logger's goroutine and the
// test's.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestWatchReadinessReportsFailuresAndRecovery: a dependency that fails
// three checks and then answers is logged once as failing (naming the
// check and its error) and once as back, and its gauge follows; a
// dependency that always answers is never logged.
func TestWatchReadinessReportsFailuresAndRecovery(t *testing.T) {
	var buf lockedBuffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	var calls atomic.Int32
	fifth := make(chan struct{}) // the round after the recovery was logged
	checks := []httpapi.Checker{
		checker{"redis", func(context.Context) error {
			switch n := calls.Add(1); {
			case n <= 3:
				return errors.New("dial tcp 127.0.0.1:1: connection refused")
			case n == 5:
				close(fifth)
			}
			return nil
		}},
		checker{"kubernetes", func(context.Context) error { return nil }},
	}
	m, err := NewMetrics(config.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- watchReadiness(ctx, log, checks, m.Broker, 0, time.Millisecond) }()
	select {
	case <-fifth:
	case <-time.After(10 * time.Second):
		t.Fatalf("no fifth check within 10 s; log:\n%s", buf.String())
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	if n := strings.Count(out, "check=redis"); n != 2 || !strings.Contains(out, "connection refused") {
		t.Errorf("log names the redis check %d times, want 2 (failing, back) with its error:\n%s", n, out)
	}
	if strings.Contains(out, "check=kubernetes") {
		t.Errorf("log names a check that passed:\n%s", out)
	}
	want := `
# HELP gpubroker_dependency_up 1 when the dependency answered this replica's last readiness check (every few seconds, as /readyz), else 0; by dependency (redis, kubernetes, oidc).
# TYPE gpubroker_dependency_up gauge
gpubroker_dependency_up{dependency="kubernetes"} 1
gpubroker_dependency_up{dependency="redis"} 1
`
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want), "gpubroker_dependency_up"); err != nil {
		t.Error(err)
	}
}
