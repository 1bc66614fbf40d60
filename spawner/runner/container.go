package runner

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

// Container waiting reasons the runner reports, with the kubelet's words.
const (
	reasonCreating       = "ContainerCreating"
	reasonConfigError    = "CreateContainerConfigError"
	reasonImageNeverPull = "ErrImageNeverPull"
	reasonCrashLoop      = "CrashLoopBackOff"
	reasonStartError     = "StartError"
)

// waitError is a reason the container cannot start yet, shown as its
// waiting state; the runner tries again on its next step.
type waitError struct{ reason, message string }

func (e *waitError) Error() string { return e.reason + ": " + e.message }

// launch is everything needed to start one container process.
type launch struct {
	argv []string
	env  []string
	dir  string
}

// prepare resolves the main container of pod (with podIP) into a launch:
// volumes mounted, environment built, command resolved. A *waitError says
// what the container waits for; other errors are failures to start it.
func (w *worker) prepare(ctx context.Context, pod *corev1.Pod, podIP string) (launch, error) {
	c := pod.Spec.Containers[0]
	img, ok := w.r.cfg.Images[c.Image]
	if !ok {
		return launch{}, &waitError{reasonImageNeverPull, fmt.Sprintf("image %q is not known to the gpubroker pod runner on node %s", c.Image, pod.Spec.NodeName)}
	}
	mounts, err := w.mountVolumes(pod, c)
	if err != nil {
		return launch{}, err
	}
	home := filepath.Join(w.dir, "home")
	runDir := filepath.Join(w.dir, "run")
	workDir := home
	if c.WorkingDir != "" {
		workDir = filepath.Join(w.dir, "root", filepath.Clean("/"+c.WorkingDir))
	}
	for _, d := range []string{home, runDir, workDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return launch{}, fmt.Errorf("pod directory: %w", err)
		}
	}

	vars := newEnvList()
	for _, kv := range w.r.cfg.BaseEnv {
		vars.setKV(kv)
	}
	for _, kv := range img.Env {
		vars.setKV(kv)
	}
	if len(img.PathDirs) > 0 {
		vars.set("PATH", strings.Join(img.PathDirs, string(os.PathListSeparator))+string(os.PathListSeparator)+vars.get("PATH"))
	}
	vars.set("HOME", home)
	vars.set("XDG_RUNTIME_DIR", runDir)
	vars.set("HOSTNAME", pod.Name)
	if err := w.envFrom(ctx, pod.Namespace, c.EnvFrom, vars); err != nil {
		return launch{}, err
	}
	for _, e := range c.Env {
		value := e.Value
		if e.ValueFrom != nil {
			v, err := w.valueFrom(ctx, pod, podIP, e.ValueFrom)
			if err != nil {
				return launch{}, err
			}
			value = v
		} else {
			value = expand(value, vars.lookup)
		}
		vars.set(e.Name, value)
	}

	argv := containerArgv(c, img, vars.lookup)
	if len(argv) == 0 {
		return launch{}, errors.New("the container has no command: neither the pod nor the image names one")
	}
	exe, err := lookPath(argv[0], vars.get("PATH"), workDir)
	if err != nil {
		return launch{}, err
	}
	argv[0] = exe
	env := vars.list()
	if l := w.r.cfg.Limiter; l != nil && mounts.preload {
		if mounts.quota == "" || mounts.usage == "" {
			return launch{}, &waitError{reasonConfigError, "the pod mounts the limiter but not its quota and usage directories"}
		}
		argv, err = l.Wrap(pod, mounts.quota, mounts.usage, argv)
		if err != nil {
			return launch{}, fmt.Errorf("limiter: %w", err)
		}
		env = append(env, l.Env...)
	}
	return launch{argv: argv, env: env, dir: workDir}, nil
}

// containerArgv applies Kubernetes' rule: command replaces the image's
// entrypoint (and its cmd), args replace its cmd; $(VAR) is expanded.
func containerArgv(c corev1.Container, img Image, lookup func(string) (string, bool)) []string {
	var argv []string
	switch {
	case len(c.Command) > 0:
		argv = append(argv, c.Command...)
		argv = append(argv, c.Args...)
	case len(c.Args) > 0:
		argv = append(argv, img.Entrypoint...)
		argv = append(argv, c.Args...)
	default:
		argv = append(argv, img.Entrypoint...)
		argv = append(argv, img.Cmd...)
	}
	for i := range argv {
		argv[i] = expand(argv[i], lookup)
	}
	return argv
}

// lookPath finds file as execvp would with the container's PATH: a name
// with a slash is taken as it is (relative to dir), else the first
// executable regular file of that name in path.
func lookPath(file, path, dir string) (string, error) {
	executable := func(p string) bool {
		st, err := os.Stat(p)
		return err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0
	}
	if strings.Contains(file, "/") {
		p := file
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		if !executable(p) {
			return "", fmt.Errorf("exec: %q: no such executable file", file)
		}
		return p, nil
	}
	for _, d := range filepath.SplitList(path) {
		if d == "" {
			d = "."
		}
		if p := filepath.Join(d, file); executable(p) {
			return p, nil
		}
	}
	return "", fmt.Errorf("exec: %q: executable file not found in $PATH", file)
}

// mounted is what the limiter needs to know of the mounted volumes.
type mounted struct {
	preload      bool   // the container mounts v1.PodPreload
	quota, usage string // local directories mounted at v1.PodQuotaDir and v1.PodUsageDir
}

// mountVolumes checks and creates the hostPath volumes the container mounts
// (mapped under HostRoot) and reports the limiter's mounts. Other volume
// kinds are accepted without local effect.
func (w *worker) mountVolumes(pod *corev1.Pod, c corev1.Container) (mounted, error) {
	var m mounted
	vols := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		vols[v.Name] = v
	}
	for _, vm := range c.VolumeMounts {
		v, ok := vols[vm.Name]
		if !ok {
			return m, &waitError{reasonConfigError, fmt.Sprintf("volume mount %q names no volume of the pod", vm.Name)}
		}
		if v.HostPath == nil {
			continue
		}
		local := filepath.Join(w.r.cfg.HostRoot, filepath.Clean("/"+v.HostPath.Path))
		typ := corev1.HostPathUnset
		if v.HostPath.Type != nil {
			typ = *v.HostPath.Type
		}
		st, err := os.Stat(local)
		switch typ {
		case corev1.HostPathDirectoryOrCreate:
			if err != nil {
				if err := os.MkdirAll(local, 0o755); err != nil {
					return m, fmt.Errorf("hostPath volume %s: %w", vm.Name, err)
				}
			} else if !st.IsDir() {
				return m, &waitError{reasonCreating, fmt.Sprintf("MountVolume.SetUp failed for volume %q: %s is not a directory", vm.Name, v.HostPath.Path)}
			}
		case corev1.HostPathFileOrCreate:
			if err != nil {
				if err := os.MkdirAll(filepath.Dir(local), 0o755); err != nil {
					return m, fmt.Errorf("hostPath volume %s: %w", vm.Name, err)
				}
				if err := os.WriteFile(local, nil, 0o644); err != nil {
					return m, fmt.Errorf("hostPath volume %s: %w", vm.Name, err)
				}
			}
		case corev1.HostPathDirectory, corev1.HostPathFile:
			if err != nil || st.IsDir() != (typ == corev1.HostPathDirectory) {
				return m, &waitError{reasonCreating, fmt.Sprintf("MountVolume.SetUp failed for volume %q: hostPath type check failed: %s is not a %s on node %s",
					vm.Name, v.HostPath.Path, strings.ToLower(string(typ)), pod.Spec.NodeName)}
			}
		}
		switch vm.MountPath {
		case v1.PodPreload:
			m.preload = true
		case v1.PodQuotaDir:
			m.quota = local
		case v1.PodUsageDir:
			m.usage = local
		}
	}
	return m, nil
}

// envFrom adds the keys of the Secrets and ConfigMaps named in from, as the
// kubelet does: keys that are not valid variable names are skipped, a
// missing source is a CreateContainerConfigError unless it is optional.
func (w *worker) envFrom(ctx context.Context, namespace string, from []corev1.EnvFromSource, vars *envList) error {
	for _, src := range from {
		var data map[string]string
		var kind, name string
		var optional bool
		switch {
		case src.SecretRef != nil:
			kind, name = "secret", src.SecretRef.Name
			optional = src.SecretRef.Optional != nil && *src.SecretRef.Optional
			s, err := w.r.cfg.Client.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
			if err == nil {
				data = map[string]string{}
				for k, v := range s.Data {
					data[k] = string(v)
				}
				for k, v := range s.StringData {
					data[k] = v
				}
			} else if !apierrors.IsNotFound(err) {
				return fmt.Errorf("get secret %s: %w", name, err)
			}
		case src.ConfigMapRef != nil:
			kind, name = "configmap", src.ConfigMapRef.Name
			optional = src.ConfigMapRef.Optional != nil && *src.ConfigMapRef.Optional
			cm, err := w.r.cfg.Client.CoreV1().ConfigMaps(namespace).Get(ctx, name, metav1.GetOptions{})
			if err == nil {
				data = cm.Data
			} else if !apierrors.IsNotFound(err) {
				return fmt.Errorf("get configmap %s: %w", name, err)
			}
		default:
			continue
		}
		if data == nil {
			if optional {
				continue
			}
			return &waitError{reasonConfigError, fmt.Sprintf("%s %q not found", kind, name)}
		}
		for k, v := range data {
			if len(validation.IsEnvVarName(src.Prefix+k)) == 0 {
				vars.set(src.Prefix+k, v)
			}
		}
	}
	return nil
}

// valueFrom resolves one env var source: downward API fields, Secret and
// ConfigMap keys. Resource fields are not supported and resolve to "".
func (w *worker) valueFrom(ctx context.Context, pod *corev1.Pod, podIP string, src *corev1.EnvVarSource) (string, error) {
	switch {
	case src.FieldRef != nil:
		path := src.FieldRef.FieldPath
		switch path {
		case "metadata.name":
			return pod.Name, nil
		case "metadata.namespace":
			return pod.Namespace, nil
		case "metadata.uid":
			return string(pod.UID), nil
		case "spec.nodeName":
			return pod.Spec.NodeName, nil
		case "spec.serviceAccountName":
			return pod.Spec.ServiceAccountName, nil
		case "status.podIP", "status.podIPs":
			return podIP, nil
		case "status.hostIP", "status.hostIPs":
			return w.r.cfg.NodeIP, nil
		}
		if k, ok := strings.CutPrefix(path, "metadata.labels['"); ok {
			return pod.Labels[strings.TrimSuffix(k, "']")], nil
		}
		if k, ok := strings.CutPrefix(path, "metadata.annotations['"); ok {
			return pod.Annotations[strings.TrimSuffix(k, "']")], nil
		}
		return "", &waitError{reasonConfigError, fmt.Sprintf("unsupported fieldRef %q", path)}
	case src.SecretKeyRef != nil:
		ref := src.SecretKeyRef
		return keyRef(pod, "Secret", ref.Name, ref.Key, ref.Optional, func() (map[string]string, error) {
			s, err := w.r.cfg.Client.CoreV1().Secrets(pod.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
			if err != nil {
				return nil, err
			}
			data := make(map[string]string, len(s.Data))
			for k, v := range s.Data {
				data[k] = string(v)
			}
			return data, nil
		})
	case src.ConfigMapKeyRef != nil:
		ref := src.ConfigMapKeyRef
		return keyRef(pod, "ConfigMap", ref.Name, ref.Key, ref.Optional, func() (map[string]string, error) {
			cm, err := w.r.cfg.Client.CoreV1().ConfigMaps(pod.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
			if err != nil {
				return nil, err
			}
			return cm.Data, nil
		})
	}
	return "", nil
}

// envList is an ordered environment: later sets of a name replace its
// value in place.
type envList struct {
	names  []string
	values map[string]string
}

func newEnvList() *envList { return &envList{values: map[string]string{}} }

func (e *envList) set(name, value string) {
	if _, ok := e.values[name]; !ok {
		e.names = append(e.names, name)
	}
	e.values[name] = value
}

func (e *envList) setKV(kv string) {
	if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
		e.set(k, v)
	}
}

func (e *envList) get(name string) string { return e.values[name] }

func (e *envList) lookup(name string) (string, bool) {
	v, ok := e.values[name]
	return v, ok
}

func (e *envList) list() []string {
	out := make([]string, 0, len(e.names))
	for _, n := range e.names {
		out = append(out, n+"="+e.values[n])
	}
	return out
}

// expand replaces $(VAR) in s with VAR's value where lookup knows it, and
// $$ with $, leaving every other $ and unknown references as they are: the
// rule of Kubernetes' command, args and env value expansion.
func expand(s string, lookup func(string) (string, bool)) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			name := s[i+2 : i+2+end]
			if v, ok := lookup(name); ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+3+end])
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

// keyRef reads key of the data get returns (a Secret's or a ConfigMap's,
// kind naming which) for an env valueFrom, as the kubelet does: a missing
// object or key waits as a config error, unless optional, when it is "".
func keyRef(pod *corev1.Pod, kind, name, key string, optional *bool, get func() (map[string]string, error)) (string, error) {
	opt := optional != nil && *optional
	data, err := get()
	switch {
	case apierrors.IsNotFound(err) && opt:
		return "", nil
	case apierrors.IsNotFound(err):
		return "", &waitError{reasonConfigError, fmt.Sprintf("%s %q not found", strings.ToLower(kind), name)}
	case err != nil:
		return "", fmt.Errorf("get %s %s: %w", strings.ToLower(kind), name, err)
	}
	v, ok := data[key]
	if !ok && !opt {
		return "", &waitError{reasonConfigError, fmt.Sprintf("couldn't find key %s in %s %s/%s", key, kind, pod.Namespace, name)}
	}
	return v, nil
}
