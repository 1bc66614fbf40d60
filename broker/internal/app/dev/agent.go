package dev

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	nvmlgpus "github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	nvmlserver "github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/kubernetes"

	"github.com/gpubroker/gpubroker/limiter/agent"
	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
)

// simulatedSymbols are the NVML functions the simulated library answers
// beyond discovery's (go-nvml's mock says every symbol exists, and calling
// one it does not implement panics): the agent calls only these and the
// discovery ones, so it skips Xid events, MPS and the attribute query, as
// it does on a driver that lacks them.
var simulatedSymbols = []string{"nvmlDeviceGetMigMode", "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetProcessUtilization"}

// simulatedNVML is dev mode's NVML: count NVIDIA H200s from go-nvml's
// mock/dgxh200 with fixed UUIDs (GPU-00000000-0000-4000-8000-00000000000N;
// the mock draws random ones), so that dev runs against one real Redis
// reuse the same GPUs instead of adding phantom ones each time.
//
// The GPUs behave as idle ones: no process runs on them (dev mode's
// notebooks run on this machine's CPU), so the running-process list is
// empty, all of the device memory is free, and the process utilization
// query answers ERROR_NOT_FOUND, NVML's answer when no process ran a kernel
// since the given time. The agent
// turns that into what a real idle GPU gives: 0 MiB used and 0 % SM.
func simulatedNVML(count int) *nvmlserver.Server {
	lib := dgxh200.NewWithGPUs(nvmlgpus.Multiple(count, nvmlgpus.H200_SXM5_141GB)...)
	for i, d := range lib.Devices {
		dev := d.(*nvmlserver.Device)
		uuid := fmt.Sprintf("GPU-00000000-0000-4000-8000-%012d", i)
		dev.GetUUIDFunc = func() (string, nvml.Return) { return uuid, nvml.SUCCESS }
		dev.MemoryInfo.Free, dev.MemoryInfo.Used = dev.MemoryInfo.Total, 0
		dev.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return []nvml.ProcessInfo{}, nvml.SUCCESS }
		dev.GetProcessUtilizationFunc = func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
			return nil, nvml.ERROR_NOT_FOUND
		}
	}
	lib.LookupSymbolFunc = func(symbol string) error {
		if slices.Contains(simulatedSymbols, symbol) {
			return nil
		}
		return fmt.Errorf("%s: not simulated in dev mode", symbol)
	}
	return lib
}

// nodeAgent is the real node agent (limiter/agent) of dev's node over the
// simulated GPUs: it heartbeats them, lays out each slice's quota and usage
// files under nodeRoot+hostRoot (the directory dev's pods mount as the
// node's), applies each resize to the slice's quota file and acknowledges
// it (agentstore.SetAppliedQuota), and writes a usage sample per slice
// every second, as on a GPU node. It only reports bypasses, never kills:
// its view of the GPUs is simulated, so no process of this machine is ever
// signalled on its word.
func nodeAgent(kube kubernetes.Interface, namespace string, rdb redis.UniversalClient, prefix, nodeRoot, hostRoot string, lib nvml.Interface, log *slog.Logger) (func(context.Context) error, error) {
	root := filepath.Join(nodeRoot, hostRoot)
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, fmt.Errorf("dev node agent: %w", err)
	}
	alog := log.With("part", "agent")
	pods := agent.NewPodWatcher(kube, devNode, func(err error) { alog.Warn("pod ignored", "err", err) }, agent.WithNamespace(namespace))
	store := agentstore.New(rdb, prefix)
	a, err := agent.New(agent.Config{Node: devNode, HostRoot: root, Enforcement: agent.Policy{Mode: agent.ModeReport}},
		agent.Deps{NVML: lib, Samples: store, Quotas: store, Audit: store, Pods: pods, Log: alog})
	if err != nil {
		return nil, fmt.Errorf("dev node agent: %w", err)
	}
	return func(ctx context.Context) error {
		g, ctx := errgroup.WithContext(ctx)
		g.Go(func() error { return pods.Run(ctx) })
		g.Go(func() error {
			if err := a.Run(ctx); err != nil {
				return fmt.Errorf("dev node agent: %w", err)
			}
			return nil
		})
		return g.Wait()
	}, nil
}
