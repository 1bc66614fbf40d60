package spawner

import (
	"errors"
	"fmt"
	"path"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Exposure is how a notebook pod gets its GPU. Both expose exactly one GPU,
// chosen by UUID by the broker's placement; there is no device plugin.
type Exposure string

// The GPU exposure strategies.
const (
	// ExposureNvidiaRuntime runs the pod with the NVIDIA runtime class and
	// NVIDIA_VISIBLE_DEVICES=<uuid> (the NVIDIA container toolkit's legacy mode).
	ExposureNvidiaRuntime Exposure = "nvidia-runtime"
	// ExposureCDI asks the container runtime for the CDI device
	// nvidia.com/gpu=<uuid> through the annotation CDIAnnotation; no runtime
	// class is set.
	ExposureCDI Exposure = "cdi"
)

// CDIAnnotation is the pod annotation that requests a CDI device
// (cdi.k8s.io/<plugin-chosen suffix>: <kind>=<name>), understood by
// containerd and CRI-O with CDI enabled.
const CDIAnnotation = "cdi.k8s.io/gpubroker"

// Defaults applied by Config.WithDefaults.
const (
	DefaultHostRoot         = "/var/lib/gpubroker"
	DefaultRuntimeClassName = "nvidia"
	DefaultNotebookPort     = 8888
	DefaultStartTimeout     = 5 * time.Minute
	DefaultErrorGrace       = 90 * time.Second
)

// Config is the cluster-wide part of every notebook pod. The zero value is not
// usable; call WithDefaults and Validate.
type Config struct {
	// Namespace holds every notebook pod and Secret; required.
	Namespace string
	// HostRoot is the absolute node directory under which the agent keeps the
	// hook (<root>/hook) and per-slice regions (<root>/slices/<spawnID>);
	// default DefaultHostRoot.
	HostRoot string
	// Exposure chooses how the GPU reaches the pod; default ExposureNvidiaRuntime.
	Exposure Exposure
	// RuntimeClassName is the runtime class used with ExposureNvidiaRuntime;
	// default DefaultRuntimeClassName.
	RuntimeClassName string
	// NotebookPort is the TCP port the notebook listens on, 1..65535; default
	// DefaultNotebookPort.
	NotebookPort int
	// StartTimeout is how long a pod may stay unschedulable, or unstarted on
	// its node, before the spawn fails; default DefaultStartTimeout.
	StartTimeout time.Duration
	// ErrorGrace is how long a retryable container error (image pull failing,
	// CreateContainerConfigError, CreateContainerError) may persist, counted
	// from the pod's scheduling, before the spawn fails. The kubelet retries
	// pulls after 10 s, 20 s and 40 s, so the default DefaultErrorGrace covers
	// three failed attempts.
	ErrorGrace time.Duration
	// ImagePullPolicy is the notebook container's pull policy; "" lets the
	// API server default it (Always for :latest, IfNotPresent otherwise).
	ImagePullPolicy corev1.PullPolicy
	// Tolerations are appended to every notebook pod (for example for tainted
	// GPU nodes). Nil means none.
	Tolerations []corev1.Toleration
}

// WithDefaults returns a copy of c with every unset field set to its default.
func (c Config) WithDefaults() Config {
	if c.HostRoot == "" {
		c.HostRoot = DefaultHostRoot
	}
	if c.Exposure == "" {
		c.Exposure = ExposureNvidiaRuntime
	}
	if c.RuntimeClassName == "" {
		c.RuntimeClassName = DefaultRuntimeClassName
	}
	if c.NotebookPort == 0 {
		c.NotebookPort = DefaultNotebookPort
	}
	if c.StartTimeout == 0 {
		c.StartTimeout = DefaultStartTimeout
	}
	if c.ErrorGrace == 0 {
		c.ErrorGrace = DefaultErrorGrace
	}
	return c
}

// Validate reports every problem with c, joined with errors.Join; nil when c
// is usable. It does not apply defaults.
func (c Config) Validate() error {
	var errs []error
	if msgs := validation.IsDNS1123Label(c.Namespace); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("namespace %q: %s", c.Namespace, msgs[0]))
	}
	if !path.IsAbs(c.HostRoot) || path.Clean(c.HostRoot) != c.HostRoot {
		errs = append(errs, fmt.Errorf("host root %q: must be a clean absolute path", c.HostRoot))
	}
	switch c.Exposure {
	case ExposureNvidiaRuntime:
		if msgs := validation.IsDNS1123Subdomain(c.RuntimeClassName); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("runtime class %q: %s", c.RuntimeClassName, msgs[0]))
		}
	case ExposureCDI:
	default:
		errs = append(errs, fmt.Errorf("exposure %q: must be %q or %q", c.Exposure, ExposureNvidiaRuntime, ExposureCDI))
	}
	if c.NotebookPort < 1 || c.NotebookPort > 65535 {
		errs = append(errs, fmt.Errorf("notebook port %d: must be 1..65535", c.NotebookPort))
	}
	if c.StartTimeout <= 0 {
		errs = append(errs, fmt.Errorf("start timeout %s: must be positive", c.StartTimeout))
	}
	if c.ErrorGrace <= 0 {
		errs = append(errs, fmt.Errorf("error grace %s: must be positive", c.ErrorGrace))
	}
	switch c.ImagePullPolicy {
	case "", corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever:
	default:
		errs = append(errs, fmt.Errorf("image pull policy %q: must be Always, IfNotPresent or Never", c.ImagePullPolicy))
	}
	return errors.Join(errs...)
}
