// Package dev is the composition root of gpubroker-dev, the whole product
// in one process on embedded defaults: it builds an app.Infra in which the
// parts a cluster would provide are embedded or simulated, each only where
// the configuration leaves it unset, and hands it to app.Run:
//   - Redis: miniredis, in memory (--redis-url or Sentinel: the real one);
//   - the OIDC issuer: broker/devissuer with an admin user dev and a
//     non-admin alice, a web login that signs dev in with one click, and a
//     token minted for the printed curl commands (--oidc-issuer: the real
//     one);
//   - the cluster: spawner/devcluster, one node (--kubeconfig: the real
//     one). When a Jupyter server is installed here (--dev-notebooks=auto,
//     the default), spawner/runner runs each notebook pod as a real local
//     Jupyter server on a loopback pod IP: the profiles' default command,
//     the docker-stacks start-notebook.sh, is a small script standing in
//     for the image that runs the local classic notebook, and so does a
//     jupyterhub-singleuser script (JupyterHub's command) when JupyterHub
//     is installed; without Jupyter the pods are moved to Running without
//     a process, and the log says how to install it;
//   - JupyterHub: --hub-token-file works as in gpubroker serve, so a local
//     hub with the spawner class (spawner/jupyterhub) can act for its
//     users; the banner prints the hub's settings;
//   - the GPUs: --dev-gpus NVIDIA H200s from go-nvml's mock/dgxh200,
//     simulated idle (no process runs on them), discovered through the
//     node agent's own code and registered with fixed UUIDs (so a run
//     against a real Redis reuses them);
//   - the node agent: the real one (limiter/agent) of the simulated node
//     over those GPUs, with a pod watcher on the cluster: it heartbeats,
//     lays out each slice's quota and usage files under a temporary node
//     directory (the one the pod runner's pods mount as the node's),
//     applies and acknowledges resizes, and writes a usage sample per
//     slice every second (0 MiB, 0 % SM: idle). It only reports bypasses
//     (ModeReport): its view is simulated, so it never signals a process;
//   - the profiles: catalog.Default (--profiles-file: the real one).
//
// Every simulated part is named in the log, in the banner and in every API
// answer (header X-Gpubroker-Mode: dev-simulated).
//
// It lives in its own binary so that the production one (gpubroker serve,
// broker/internal/app) links none of it: no miniredis, fake clientset,
// NVML mock, httptest or token minting, and no cgo (go-nvml needs it; dev
// mode does, the broker does not). A build tag would do the same, but a
// second main keeps both builds in every `go build ./...`, `go vet` and
// test run, with nothing to remember.
package dev
