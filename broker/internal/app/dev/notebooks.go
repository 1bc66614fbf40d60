package dev

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/broker/internal/fleet"
	"github.com/gpubroker/gpubroker/spawner/runner"
)

// jupyterCandidates are the interpreters tried for a local Jupyter server,
// in order: Debian's (the python3 on PATH may be another one), then PATH's.
var jupyterCandidates = []string{"/usr/bin/python3", "python3"}

// installHint says how to get real notebooks in dev mode.
const installHint = "install Jupyter to open real notebooks (Debian/Ubuntu: apt-get install python3-notebook python3-ipykernel; elsewhere: python3 -m pip install notebook)"

// findJupyter returns an interpreter that can run the classic notebook
// server and a Python kernel, or an error saying what is missing.
func findJupyter(ctx context.Context) (string, error) {
	var tried []string
	for _, c := range jupyterCandidates {
		py, err := exec.LookPath(c)
		if err != nil {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		err = exec.CommandContext(cctx, py, "-c", "import notebook.notebookapp, ipykernel").Run()
		cancel()
		if err == nil {
			return py, nil
		}
		tried = append(tried, py)
	}
	if len(tried) == 0 {
		return "", errors.New("no python3 found")
	}
	return "", fmt.Errorf("%s cannot import notebook and ipykernel", strings.Join(tried, " and "))
}

// startNotebookScript stands in for the Jupyter docker-stacks images'
// start-notebook.sh (the profiles' default command): it runs the classic
// notebook server of the interpreter %s on the pod's IP, translating the
// jupyter_server options (--ServerApp.*) the default command passes. The
// token comes from JUPYTER_TOKEN, which the notebook reads itself.
const startNotebookScript = `#!/bin/sh
# gpubroker-dev: a local stand-in for the docker-stacks start-notebook.sh.
n=$#
while [ "$n" -gt 0 ]; do
  a=$1; shift; n=$((n - 1))
  case $a in --ServerApp.*) a="--NotebookApp.${a#--ServerApp.}" ;; esac
  set -- "$@" "$a"
done
exec %q -m notebook --no-browser --allow-root --ip="$GPUBROKER_POD_IP" --port=8888 \
  --NotebookApp.allow_remote_access=True "$@"
`

// singleuserScript stands in for a notebook image's jupyterhub-singleuser,
// the command JupyterHub's spawner class asks for: it runs the installed
// one (%[1]s) on the pod's IP, since the local pods share this machine's
// network and the hub's 0.0.0.0:8888 would be one port for all, with the
// classic notebook UI (jupyterhub-singleuser 3.0 would wrap jupyter_server
// when installed, which has no UI here) unless the hub sets the app.
const singleuserScript = `#!/bin/sh
# gpubroker-dev: a local stand-in for an image's jupyterhub-singleuser.
: "${JUPYTERHUB_SINGLEUSER_APP:=notebook.notebookapp.NotebookApp}"
export JUPYTERHUB_SINGLEUSER_APP
exec %[1]q "$@" --ip="$GPUBROKER_POD_IP" --port=8888 --allow-root --NotebookApp.allow_remote_access=True
`

// localNotebooks prepares the pod runner that makes dev mode's notebook
// pods real local Jupyter servers: a directory for the runner (removed by
// the returned cleanup), the start script standing in for every profile's
// image, and the node's hook directory that the pods mount, under node
// (the simulated node's filesystem root, where the node agent keeps the
// slices' files under hostRoot too). It returns nil
// and the reason when Jupyter is missing or pod IPs cannot be bound here.
func localNotebooks(ctx context.Context, log *slog.Logger, kube kubernetes.Interface, namespace, node, hostRoot string, profiles []fleet.Profile) (*runner.Runner, func(), string, error) {
	py, err := findJupyter(ctx)
	if err != nil {
		return nil, nil, fmt.Sprintf("no local Jupyter server (%v); %s", err, installHint), nil
	}
	if ln, err := net.Listen("tcp", net.JoinHostPort(runner.DefaultCIDR.Addr().Next().String(), "0")); err != nil {
		return nil, nil, fmt.Sprintf("this machine cannot bind loopback pod addresses in %s (%v), which the local notebooks need", runner.DefaultCIDR, err), nil
	} else {
		ln.Close()
	}
	dir, err := os.MkdirTemp("", "gpubroker-dev-notebooks-")
	if err != nil {
		return nil, nil, "", fmt.Errorf("dev notebooks: %w", err)
	}
	cleanup := func() { _ = os.RemoveAll(dir) }
	fail := func(err error) (*runner.Runner, func(), string, error) {
		cleanup()
		return nil, nil, "", fmt.Errorf("dev notebooks: %w", err)
	}
	bin := filepath.Join(dir, "image-bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return fail(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "start-notebook.sh"), fmt.Appendf(nil, startNotebookScript, py), 0o755); err != nil {
		return fail(err)
	}
	// A hub's spawns run jupyterhub-singleuser; without JupyterHub here
	// they fail with the runner's "not found", in the program's words.
	if su, err := exec.LookPath("jupyterhub-singleuser"); err == nil {
		if err := os.WriteFile(filepath.Join(bin, "jupyterhub-singleuser"), fmt.Appendf(nil, singleuserScript, su), 0o755); err != nil {
			return fail(err)
		}
	}
	hook := filepath.Join(node, hostRoot, v1.HostHookSubdir)
	if err := os.MkdirAll(hook, 0o755); err != nil {
		return fail(err)
	}
	if err := os.WriteFile(filepath.Join(hook, "ld.so.preload"), nil, 0o644); err != nil {
		return fail(err)
	}
	images := map[string]runner.Image{}
	for _, p := range profiles {
		images[p.Image] = runner.Image{PathDirs: []string{bin}}
	}
	r, err := runner.New(runner.Config{
		Client: kube, Namespace: namespace, Nodes: []string{devNode}, Dir: filepath.Join(dir, "pods"), HostRoot: node,
		Images: images, Backoff: 2 * time.Second, MaxBackoff: 30 * time.Second, StopGrace: 5 * time.Second,
		Log: log.With("part", "runner"),
	})
	if err != nil {
		return fail(err)
	}
	return r, cleanup, "", nil
}
