package app

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/gpubroker/gpubroker/broker/internal/httpapi"
)

func TestWarnIfNotReadyLogsEachFailingDependency(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	checks := []httpapi.Checker{
		checker{"redis", func(context.Context) error { return errors.New("dial tcp 127.0.0.1:1: connection refused") }},
		checker{"kubernetes", func(context.Context) error { return nil }},
	}
	if err := warnIfNotReady(t.Context(), log, checks, 0); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	if !strings.Contains(out, "check=redis") || !strings.Contains(out, "connection refused") {
		t.Errorf("log %q does not name the failing redis check and its error", out)
	}
	if strings.Contains(out, "check=kubernetes") {
		t.Errorf("log %q names a check that passed", out)
	}
}
