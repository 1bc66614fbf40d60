// Package podhook runs a notebook pod's process under the real GPU limiter
// on a machine without a GPU: the production hook (libgpulimit.so, by
// LD_PRELOAD) over the stub driver (limiter/hook/stub), in the pod's slice.
// It is the pod runner's (spawner/runner) Limiter for the e2e tests and dev
// mode: the caller wires it as
//
//	runner.Limiter{Wrap: l.Wrap, Env: l.Env()}
//
// so that spawner/runner and this package never import each other.
//
// Wrap plays the node agent's part for the pod first: it reads the pod's
// slice annotations with the agent's own agent.SliceFromPod and lays out the
// slice's directories and initial quota file with agent.PrepareSlice (the
// same code the agent runs when it sees a pod). The process then runs under
// limiter/hook/build/podrun, which mounts the slice's quota directory
// read-only and its usage directory read-write at the hook's fixed in-pod
// paths in a private mount namespace and drops every capability, as the
// pod's container would (limiter/hook/README.md, "Threat model"). The hook
// reads its quota from nothing else: no variable names a path or a limit.
//
// The C artifacts must be built (stubtest.Need in tests, or `go tool task
// limiter:build`); New checks that they are.
package podhook

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
	"github.com/gpubroker/gpubroker/limiter/agent"
	"github.com/gpubroker/gpubroker/limiter/hook/stubtest"
)

// Limiter runs pod processes under the hook over one simulated GPU. Its
// methods are safe for concurrent use.
type Limiter struct {
	state string // the stub driver's device state file
}

// New returns a Limiter whose processes share the simulated GPU whose state
// is the file stubState (created by the stub driver on first use; an
// absolute path outside /run and /var/run, which podrun covers). It fails
// when the hook, the stub driver or podrun are not built.
func New(stubState string) (*Limiter, error) {
	if !filepath.IsAbs(stubState) {
		return nil, fmt.Errorf("podhook: stub state %q is not an absolute path", stubState)
	}
	var errs []error
	for _, f := range []string{stubtest.HookLibrary(), filepath.Join(stubtest.StubDir(), "libcuda.so.1"),
		filepath.Join(stubtest.StubDir(), "libnvidia-ml.so.1"), podrun()} {
		if _, err := os.Stat(f); err != nil {
			errs = append(errs, fmt.Errorf("podhook: %w (build it with `go tool task limiter:build`)", err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &Limiter{state: stubState}, nil
}

func podrun() string { return filepath.Join(stubtest.BuildDir(), "podrun") }

// Env is what a limited process gets on top of the pod's environment: the
// hook in LD_PRELOAD, the stub driver's directory in LD_LIBRARY_PATH and
// the stub's state file (GPUBROKER_STUB_STATE, read by the stub only).
func (l *Limiter) Env() []string {
	return []string{
		"LD_PRELOAD=" + stubtest.HookLibrary(),
		"LD_LIBRARY_PATH=" + stubtest.StubDir(),
		"GPUBROKER_STUB_STATE=" + l.state,
	}
}

// Wrap prepares pod's slice as the node agent does and returns the argv
// that runs argv inside it under podrun. quotaDir and usageDir are the
// local directories the pod mounts at v1.PodQuotaDir and v1.PodUsageDir;
// they must be <host root>/slices/<spawn id>/quota and .../usage for the
// pod's own spawn id (the pod contract's layout), else Wrap fails rather
// than write a quota where the process would not read it. Errors: the
// pod's annotations describe no slice (agent.ErrBadPod), the layout does
// not match, or the slice's files cannot be written.
func (l *Limiter) Wrap(pod *corev1.Pod, quotaDir, usageDir string, argv []string) ([]string, error) {
	s, err := agent.SliceFromPod(pod)
	if err != nil {
		return nil, err
	}
	sliceDir := filepath.Dir(quotaDir)
	root := filepath.Dir(filepath.Dir(sliceDir))
	if filepath.Base(quotaDir) != "quota" || usageDir != filepath.Join(sliceDir, "usage") ||
		sliceDir != filepath.Join(root, v1.HostSlicesSubdir, s.ID) {
		return nil, fmt.Errorf("pod %s/%s mounts %s and %s, not its slice's <root>/%s/%s/{quota,usage}",
			pod.Namespace, pod.Name, quotaDir, usageDir, v1.HostSlicesSubdir, s.ID)
	}
	if _, _, err := agent.PrepareSlice(root, s); err != nil {
		return nil, err
	}
	return append([]string{podrun(), "-q", quotaDir, "-u", usageDir}, argv...), nil
}
