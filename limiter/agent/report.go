package agent

// The node report: the heartbeat that carries every device, the sharing
// mode the node's label asks for, and each GPU's promised-vs-delivered
// summary.

import (
	"context"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/limiter/agent/agentstore"
)

// heartbeatLoop writes the node report at once, every HeartbeatInterval,
// and whenever a device's health changes, until ctx ends.
func (a *Agent) heartbeatLoop(ctx context.Context) error {
	t := a.clock.NewTicker(a.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		a.Heartbeat(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
		case <-a.devs.changed:
		}
	}
}

// Heartbeat writes the node report once; a failure is logged and counted.
// It first reads the node's sharing label (NodeLabels), so the report asks
// for the mode the label names.
func (a *Agent) Heartbeat(ctx context.Context) {
	a.readLabel(ctx)
	r := a.nodeReport()
	if err := a.samples.Heartbeat(ctx, r); err != nil {
		a.metrics.errors.WithLabelValues("redis").Inc()
		a.log.WarnContext(ctx, "heartbeat not written", "err", err)
	}
}

// nodeReport is the node report as of now: every device, the GPUs not in
// MIG mode asking for the mode the node's label names, and each GPU's
// promised-vs-delivered summary.
func (a *Agent) nodeReport() agentstore.NodeReport {
	gpus := a.devs.reports()
	a.modeMu.Lock()
	requested := a.requested
	a.modeMu.Unlock()
	summaries := a.guaranteeSummaries()
	for i := range gpus {
		if gpus[i].Mode != v1.SharingMIG {
			gpus[i].Mode = requested
		}
		if g, ok := summaries[gpus[i].UUID]; ok {
			gpus[i].Guarantee = &g
		}
	}
	return agentstore.NodeReport{
		Node:        a.cfg.Node,
		At:          a.clock.Now(),
		HeartbeatMs: a.cfg.HeartbeatInterval.Milliseconds(),
		SampleMs:    a.cfg.SampleInterval.Milliseconds(),
		GPUs:        gpus,
	}
}

// setRequestedMode sets the mode the node's label asks for ("" = none).
func (a *Agent) setRequestedMode(m v1.SharingMode) {
	a.modeMu.Lock()
	a.requested = m
	a.modeMu.Unlock()
}

// readLabel reads the node's sharing label, if the agent has a way to
// (Deps.NodeLabels), and keeps the mode it names; a failed read keeps the
// last one (logged), a label naming no mode the GPUs may be set to is
// logged and asks for nothing.
func (a *Agent) readLabel(ctx context.Context) {
	if a.labels == nil {
		return
	}
	l, err := a.labels.NodeLabels(ctx)
	if err != nil {
		a.metrics.errors.WithLabelValues("kube").Inc()
		a.log.WarnContext(ctx, "node labels not read; keeping the last sharing mode", "err", err)
		return
	}
	m := v1.SharingMode(l[v1.LabelSharing])
	switch m {
	case "", v1.SharingSliced, v1.SharingExclusive, v1.SharingMPS:
	default:
		a.log.WarnContext(ctx, "node label names no sharing mode a GPU can be set to (sliced, exclusive, mps; MIG is the GPU's own)",
			"label", v1.LabelSharing, "value", string(m))
		m = ""
	}
	a.setRequestedMode(m)
}
