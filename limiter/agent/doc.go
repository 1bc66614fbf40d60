// Package agent is the node agent's library: what gpubroker-agent does on a
// GPU node with an injected nvml.Interface (github.com/NVIDIA/go-nvml).
//
// So far it discovers the node's GPUs for placement (Discover). Usage
// sampling, live quota files and bypass enforcement come with the node agent
// (DESIGN.md, "Parts and processes").
//
// NVML is always an injected value, never a package-level call, so tests run
// on go-nvml's mock servers (mock/dgxh200) and, in CI, on the stub
// libnvidia-ml.so.1 under limiter/hook/stub.
package agent
