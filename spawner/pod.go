package spawner

import (
	"errors"
	"fmt"
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"

	v1 "github.com/gpubroker/gpubroker/broker/api/v1"
)

// ContainerName is the name of the notebook container in every pod.
const ContainerName = "notebook"

// portName names the notebook's container port.
const portName = "notebook"

// Volume names of the limiter mounts.
const (
	volumeHook    = "gpubroker-hook"
	volumePreload = "gpubroker-preload"
	volumeQuota   = "gpubroker-quota"
	volumeUsage   = "gpubroker-usage"
	volumeMPSPipe = "gpubroker-mps-pipe"
	volumeMPSShm  = "gpubroker-mps-shm"
)

// preloadFileName is the file under <root>/hook that names the hook library;
// it is mounted over /etc/ld.so.preload.
const preloadFileName = "ld.so.preload"

// Spec is one spawn of one server: what the broker decided, in raw form.
type Spec struct {
	// User and Server are the raw names; Server "" is the default server.
	// User must not be empty.
	User, Server string
	// SpawnID identifies this start of the server and is the slice id; it
	// must be a valid label value (≤ 63 characters, [A-Za-z0-9._-], alphanumeric
	// at both ends).
	SpawnID string
	// Profile is the name of the profile the server was started with.
	Profile string
	// Image is the notebook image reference; required.
	Image string
	// CPU and Memory are resource quantities ("500m", "4Gi"); "" sets no
	// request. Memory is also the limit.
	CPU, Memory string
	// Slice is the GPU share; MemoryMiB > 0, 1 ≤ ComputePercent ≤
	// ComputeLimitPercent ≤ 100.
	Slice v1.Slice
	// Sharing is the server's sharing mode; "" is sliced.
	Sharing v1.SharingMode
	// GPU is the placed device; UUID and Node are required. For a MIG
	// server UUID is the MIG instance's ("MIG-…") and MIGProfile and
	// ParentUUID are set.
	GPU v1.GPURef
	// QuotaGroups are the raw group names the slice is charged to; none may
	// be empty or contain ','.
	QuotaGroups []string
	// IdempotencyKey is the key of the create that started the spawn, kept
	// in an annotation (v1.AnnotationIdempotencyKey) so a record rebuilt
	// from the pod still answers that key's retry; "" sets none.
	IdempotencyKey string
	// Env is plain environment for the notebook; names must be valid and may
	// not start with GPUBROKER_ or NVIDIA_ or be LD_PRELOAD. Never put
	// credentials here: they belong in the Secret (SecretEnv).
	Env map[string]string
	// SecretEnv, when true, makes the pod take environment from the server's
	// Secret (SecretName) through envFrom.
	SecretEnv bool
	// Command and Args become the notebook container's command and args
	// (Kubernetes semantics: Command replaces the image's ENTRYPOINT, Args its
	// CMD); nil or empty keeps the image's. Command[0], when given, must not
	// be empty. The broker checks their size at the API's edge
	// (v1.CreateServerRequest).
	Command, Args []string
}

// PodName returns the pod name of a server: "nb-<user slug>" for the default
// server ("") and "nb-<user slug>--<server slug>" otherwise, at most
// MaxNameLen characters. Because slugs never contain "--" the name is unique
// per (user, server).
func PodName(user, server string) string { return composeName("nb-", "", user, server) }

// SecretName returns the name of a server's environment Secret:
// PodName(user, server) with "-env" appended to the user/server part, at most
// MaxNameLen characters.
func SecretName(user, server string) string { return composeName("nb-", "-env", user, server) }

// composeName builds prefix + slug(user) ["--" + slug(server)] + suffix within
// MaxNameLen, shortening the longer part first (each part stays injective
// because SlugN is injective for any budget).
func composeName(prefix, suffix, user, server string) string {
	room := MaxNameLen - len(prefix) - len(suffix)
	if server == "" {
		return prefix + SlugN(user, room) + suffix
	}
	room -= 2 // "--"
	u, s := Slug(user), Slug(server)
	if len(u)+len(s) > room {
		half := room / 2
		switch {
		case len(u) <= half:
			s = SlugN(server, room-len(u))
		case len(s) <= half:
			u = SlugN(user, room-len(s))
		default:
			u, s = SlugN(user, half), SlugN(server, room-half)
		}
	}
	return prefix + u + "--" + s + suffix
}

// BaseURL returns the path a server's notebook is served under through the
// broker's proxy: "/user/<Slug(user)>/<Slug(server)>/". Slugs need no
// escaping in a URL path and are never "." or "..", and Slug is injective,
// so the path names exactly one server.
func BaseURL(user, server string) string {
	return "/user/" + Slug(user) + "/" + Slug(server) + "/"
}

// Labels returns the labels of a server's pod and Secret.
func Labels(user, server, spawnID string) map[string]string {
	return map[string]string{
		v1.LabelManagedBy: v1.ManagedByValue,
		v1.LabelUser:      Slug(user),
		v1.LabelServer:    Slug(server),
		v1.LabelSpawnID:   spawnID,
	}
}

// Pod builds the notebook pod of one spawn. It is pure: the same cfg and s
// give the same pod. cfg must have passed WithDefaults and Validate. Errors
// wrap ErrInvalid and list every problem with s.
//
// The pod runs with restartPolicy OnFailure: a crashed or OOM-killed notebook
// restarts in place and keeps its slice, while a notebook that exits cleanly
// (the user chose "Shut down") ends the pod as Succeeded, which the broker
// reads as "the server stopped" instead of restarting it against the user's
// wish (Always would do that).
func Pod(cfg Config, s Spec) (*corev1.Pod, error) {
	res, err := validateSpec(s)
	if err != nil {
		return nil, err
	}
	podName := PodName(s.User, s.Server)
	annotations := map[string]string{
		v1.AnnotationUser:                s.User,
		v1.AnnotationServer:              s.Server,
		v1.AnnotationProfile:             s.Profile,
		v1.AnnotationSpawnID:             s.SpawnID,
		v1.AnnotationGPUUUID:             s.GPU.UUID,
		v1.AnnotationNode:                s.GPU.Node,
		v1.AnnotationMemoryMiB:           strconv.FormatInt(s.Slice.MemoryMiB, 10),
		v1.AnnotationComputePercent:      strconv.Itoa(s.Slice.ComputePercent),
		v1.AnnotationComputeLimitPercent: strconv.Itoa(s.Slice.ComputeLimitPercent),
	}
	if len(s.QuotaGroups) > 0 {
		annotations[v1.AnnotationGroups] = strings.Join(s.QuotaGroups, ",")
	}
	mode := s.Sharing
	if mode == "" {
		mode = v1.SharingSliced
	}
	annotations[v1.AnnotationSharing] = string(mode)
	if mode == v1.SharingMIG {
		annotations[v1.AnnotationMIGProfile] = s.GPU.MIGProfile
		annotations[v1.AnnotationParentUUID] = s.GPU.ParentUUID
	}
	if s.IdempotencyKey != "" {
		annotations[v1.AnnotationIdempotencyKey] = s.IdempotencyKey
	}

	// The slice reaches the limiter only through the read-only quota
	// mount, never the environment, which the notebook user controls
	// (ARCHITECTURE.md invariant 3): the node agent writes the first quota
	// file from the annotations as soon as it sees this pod. The env says
	// only where the notebook is served and the pod's IP.
	env := []corev1.EnvVar{
		{Name: v1.EnvBaseURL, Value: BaseURL(s.User, s.Server)},
		{Name: v1.EnvPodIP, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "status.podIP"}}},
	}
	var runtimeClass *string
	switch cfg.Exposure {
	case ExposureCDI:
		annotations[CDIAnnotation] = "nvidia.com/gpu=" + s.GPU.UUID
	default:
		runtimeClass = ptr(cfg.RuntimeClassName)
		env = append(env,
			corev1.EnvVar{Name: "NVIDIA_VISIBLE_DEVICES", Value: s.GPU.UUID},
			corev1.EnvVar{Name: "NVIDIA_DRIVER_CAPABILITIES", Value: "compute,utility"},
		)
	}
	for _, name := range slices.Sorted(maps.Keys(s.Env)) {
		env = append(env, corev1.EnvVar{Name: name, Value: s.Env[name]})
	}
	var envFrom []corev1.EnvFromSource
	if s.SecretEnv {
		envFrom = []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: SecretName(s.User, s.Server)},
		}}}
	}

	hookDir := path.Join(cfg.HostRoot, v1.HostHookSubdir)
	sliceDir := path.Join(cfg.HostRoot, v1.HostSlicesSubdir, s.SpawnID)
	// The quota directory read-only (the hook uses a quota file only on a
	// read-only mount); the usage directory read-write for the hooks'
	// shared mapping, but root's and 0755 on the host (the agent makes it
	// so), so a notebook user who is not root cannot replace the file in
	// it.
	mounts := []corev1.VolumeMount{
		{Name: volumeHook, MountPath: v1.PodHookDir, ReadOnly: true},
		{Name: volumePreload, MountPath: v1.PodPreload, ReadOnly: true},
		{Name: volumeQuota, MountPath: v1.PodQuotaDir, ReadOnly: true},
		{Name: volumeUsage, MountPath: v1.PodUsageDir},
	}
	volumes := []corev1.Volume{
		hostPathVolume(volumeHook, hookDir, corev1.HostPathDirectory),
		hostPathVolume(volumePreload, path.Join(hookDir, preloadFileName), corev1.HostPathFile),
		hostPathVolume(volumeQuota, path.Join(sliceDir, "quota"), corev1.HostPathDirectoryOrCreate),
		hostPathVolume(volumeUsage, path.Join(sliceDir, "usage"), corev1.HostPathDirectoryOrCreate),
	}
	if mode == v1.SharingMPS {
		// The GPU's MPS pipe directory at the clients' default path, so no
		// variable names it; read-only, since clients only connect to its
		// sockets. No variable carries the client's limits either: the node
		// agent sets them on the GPU's MPS control daemon, where a client
		// can only lower them (limiter/agent, "MPS"). The MPS shared memory
		// replaces the container's /dev/shm.
		mpsDir := path.Join(cfg.HostRoot, v1.HostMPSSubdir)
		mounts = append(mounts,
			corev1.VolumeMount{Name: volumeMPSPipe, MountPath: v1.PodMPSPipeDir, ReadOnly: true},
			corev1.VolumeMount{Name: volumeMPSShm, MountPath: v1.PodMPSShmDir})
		volumes = append(volumes,
			hostPathVolume(volumeMPSPipe, path.Join(mpsDir, s.GPU.UUID, "pipe"), corev1.HostPathDirectory),
			hostPathVolume(volumeMPSShm, path.Join(mpsDir, "shm"), corev1.HostPathDirectory))
	}
	pod := &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{
			Name:        podName,
			Namespace:   cfg.Namespace,
			Labels:      Labels(s.User, s.Server, s.SpawnID),
			Annotations: annotations,
			// The pod outlives its deletion until the broker has recorded
			// the server's end (Client.ReleasePod).
			Finalizers: []string{v1.FinalizerServerRecord},
		},
		Spec: corev1.PodSpec{
			NodeName:                     s.GPU.Node,
			RuntimeClassName:             runtimeClass,
			RestartPolicy:                corev1.RestartPolicyOnFailure,
			AutomountServiceAccountToken: ptr(false),
			EnableServiceLinks:           ptr(false),
			Tolerations:                  slices.Clone(cfg.Tolerations),
			SecurityContext: &corev1.PodSecurityContext{
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name:            ContainerName,
				Image:           s.Image,
				Command:         slices.Clone(s.Command),
				Args:            slices.Clone(s.Args),
				ImagePullPolicy: cfg.ImagePullPolicy,
				// A notebook that fails reports its last output lines as
				// the reason, so a crash reads as the program's own words.
				TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
				Ports: []corev1.ContainerPort{{
					Name: portName, ContainerPort: int32(cfg.NotebookPort), Protocol: corev1.ProtocolTCP,
				}},
				Env:       env,
				EnvFrom:   envFrom,
				Resources: res,
				ReadinessProbe: &corev1.Probe{
					ProbeHandler:     corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromString(portName)}},
					PeriodSeconds:    2,
					FailureThreshold: 3,
				},
				VolumeMounts: mounts,
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptr(false),
					// No capabilities: a root notebook cannot remount the
					// read-only quota directory or override the usage
					// directory's permissions (invariant 3). The pod's
					// RuntimeDefault seccomp profile refuses new user
					// namespaces, in which it could mount its own.
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
			Volumes: volumes,
		},
	}
	return pod, nil
}

// Secret builds the environment Secret of one spawn, holding env as data.
// It carries the same labels as the pod and the raw names as annotations.
// Keys are not validated here; Client.Create checks them.
func Secret(cfg Config, s Spec, env map[string]string) *corev1.Secret {
	data := make(map[string][]byte, len(env))
	for k, v := range env {
		data[k] = []byte(v)
	}
	return &corev1.Secret{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      SecretName(s.User, s.Server),
			Namespace: cfg.Namespace,
			Labels:    Labels(s.User, s.Server, s.SpawnID),
			Annotations: map[string]string{
				v1.AnnotationUser:    s.User,
				v1.AnnotationServer:  s.Server,
				v1.AnnotationSpawnID: s.SpawnID,
			},
		},
		Type: corev1.SecretTypeOpaque,
		Data: data,
	}
}

func hostPathVolume(name, hostPath string, typ corev1.HostPathType) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{
		HostPath: &corev1.HostPathVolumeSource{Path: hostPath, Type: ptr(typ)},
	}}
}

func ptr[T any](v T) *T { return &v }

// reservedEnv reports whether name is set by the spawner and may not come
// from a user.
func reservedEnv(name string) bool {
	return strings.HasPrefix(name, "GPUBROKER_") || strings.HasPrefix(name, "NVIDIA_") || strings.HasPrefix(name, "CUDA_MPS_") ||
		name == "LD_PRELOAD" || name == "CUDA_VISIBLE_DEVICES"
}

// validateSpec checks s and returns its resource requirements; the error
// wraps ErrInvalid and lists every problem.
func validateSpec(s Spec) (corev1.ResourceRequirements, error) {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if s.User == "" {
		bad("user is empty")
	}
	if msgs := validation.IsValidLabelValue(s.SpawnID); s.SpawnID == "" || len(msgs) > 0 {
		bad("spawn id %q is not a valid label value", s.SpawnID)
	}
	if s.Image == "" || strings.ContainsFunc(s.Image, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		bad("image %q is empty or contains spaces", s.Image)
	}
	res := corev1.ResourceRequirements{}
	for _, q := range []struct {
		name  corev1.ResourceName
		value string
	}{{corev1.ResourceCPU, s.CPU}, {corev1.ResourceMemory, s.Memory}} {
		if q.value == "" {
			continue
		}
		qty, err := resource.ParseQuantity(q.value)
		switch {
		case err != nil:
			bad("%s quantity %q: %w", q.name, q.value, err)
		case qty.Sign() <= 0:
			bad("%s quantity %q must be positive", q.name, q.value)
		default:
			if res.Requests == nil {
				res.Requests = corev1.ResourceList{}
			}
			res.Requests[q.name] = qty
			if q.name == corev1.ResourceMemory {
				res.Limits = corev1.ResourceList{corev1.ResourceMemory: qty}
			}
		}
	}
	if s.Slice.MemoryMiB <= 0 {
		bad("slice memory %d MiB must be positive", s.Slice.MemoryMiB)
	}
	if c := s.Slice.ComputePercent; c < 1 || c > 100 {
		bad("slice compute %d%% must be 1..100", c)
	}
	if l := s.Slice.ComputeLimitPercent; l < s.Slice.ComputePercent || l > 100 {
		bad("slice compute limit %d%% must be %d..100", l, s.Slice.ComputePercent)
	}
	if s.GPU.UUID == "" || strings.ContainsFunc(s.GPU.UUID, func(r rune) bool {
		return !(r == '-' || '0' <= r && r <= '9' || 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z')
	}) {
		bad("gpu uuid %q must be non-empty letters, digits and '-'", s.GPU.UUID)
	}
	if msgs := validation.IsDNS1123Subdomain(s.GPU.Node); len(msgs) > 0 {
		bad("gpu node %q: %s", s.GPU.Node, msgs[0])
	}
	switch s.Sharing {
	case "", v1.SharingSliced, v1.SharingExclusive, v1.SharingMPS:
		if s.GPU.MIGProfile != "" || s.GPU.ParentUUID != "" {
			bad("gpu %s: a MIG profile and parent are only for sharing mig", s.GPU.UUID)
		}
	case v1.SharingMIG:
		if s.GPU.MIGProfile == "" || s.GPU.ParentUUID == "" || !strings.HasPrefix(s.GPU.UUID, "MIG-") {
			bad("a MIG server needs its instance's uuid (MIG-…), MIG profile and parent GPU, got %q, %q, %q", s.GPU.UUID, s.GPU.MIGProfile, s.GPU.ParentUUID)
		}
	default:
		bad("sharing mode %q is not sliced, exclusive, mig or mps", s.Sharing)
	}
	for _, g := range s.QuotaGroups {
		if g == "" || strings.Contains(g, ",") {
			bad("quota group %q must be non-empty and contain no ','", g)
		}
	}
	if len(s.Command) > 0 && s.Command[0] == "" {
		bad("command[0] is empty")
	}
	for _, name := range slices.Sorted(maps.Keys(s.Env)) {
		if msgs := validation.IsEnvVarName(name); len(msgs) > 0 {
			bad("env %q: %s", name, msgs[0])
		} else if reservedEnv(name) {
			bad("env %q is reserved for gpubroker", name)
		}
	}
	if len(errs) > 0 {
		return res, fmt.Errorf("%w: %w", ErrInvalid, errors.Join(errs...))
	}
	return res, nil
}
