package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestDevPointsToItsOwnBinary(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"dev", "--dev-gpus=2"}, nil, &stdout, &stderr); code != 2 {
		t.Errorf("gpubroker dev: exit %d, want 2", code)
	}
	if !strings.Contains(stderr.String(), "gpubroker-dev") || !strings.Contains(stderr.String(), "go tool task dev") {
		t.Errorf("gpubroker dev does not point to gpubroker-dev and go tool task dev:\n%s", stderr.String())
	}
}

func TestServeHelpListsOnlyWhatServeReads(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"serve", "--help"}, nil, &stdout, &stderr); code != 0 {
		t.Fatalf("serve --help: exit %d\n%s", code, stderr.String())
	}
	help := stdout.String()
	if !strings.Contains(help, "  --redis-url URL\n") || strings.Contains(help, "dev-gpus") || strings.Contains(help, "dev mode") {
		t.Errorf("serve --help lists dev mode's settings or lacks serve's:\n%s", help)
	}
}
