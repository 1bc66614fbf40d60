package cliconfig

import (
	"fmt"
	"strconv"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Kube is how a binary reaches the Kubernetes API server.
type Kube struct {
	// Kubeconfig is a kubeconfig path; "" means the pod's in-cluster config
	// (its service account).
	Kubeconfig string
	// QPS and Burst are the client's rate limit (a token bucket: Burst
	// requests at once, refilled at QPS per second); > 0 each.
	QPS   float64
	Burst int
}

// KubeDefaults are a binary's defaults for its Kubernetes flags.
type KubeDefaults struct {
	// Kubeconfig is --kubeconfig's default as the help shows it.
	Kubeconfig string
	// QPS and Burst are the rate limit's defaults; Source says where they
	// come from, for the help ("kube-scheduler's").
	QPS    float64
	Burst  int
	Source string
}

// Flags returns the Kubernetes flags bound to k: --kubeconfig,
// --kube-api-qps and --kube-api-burst, with d's defaults.
func (k *Kube) Flags(d KubeDefaults) []Flag {
	return []Flag{
		{Name: "kubeconfig", Placeholder: "PATH", Value: String(&k.Kubeconfig), DefaultDoc: d.Kubeconfig,
			Help:  "Kubeconfig file naming the Kubernetes API server and the credentials for it.",
			Check: func() error { return checkOptionalFile(k.Kubeconfig) }},
		{Name: "kube-api-qps", Placeholder: "QPS", Value: Float(&k.QPS), Default: strconv.FormatFloat(d.QPS, 'g', -1, 64),
			Help: "Requests per second the Kubernetes client sustains (client-go's own default is 5; this default is " + d.Source + "); the API server's priority and fairness protects it beyond that.",
			Check: func() error {
				if k.QPS <= 0 {
					return fmt.Errorf("must be > 0, got %g", k.QPS)
				}
				return nil
			}},
		{Name: "kube-api-burst", Placeholder: "N", Value: Int(&k.Burst), Default: strconv.Itoa(d.Burst),
			Help:  "Requests the Kubernetes client may send at once above --kube-api-qps (client-go's own default is 10; this default is " + d.Source + ").",
			Check: AtLeast(&k.Burst, 1)},
	}
}

// RESTConfig builds the client configuration from Kubeconfig, or from the
// in-cluster service account when it is "", with userAgent and the rate
// limit (QPS, Burst; zero values leave client-go's 5 and 10) set, speaking
// protobuf to the API server (JSON where a resource has no protobuf form),
// as Kubernetes' own controllers do (kube-controller-manager's
// --kube-api-content-type): listing and watching thousands of pods and
// Secrets then costs a fraction of JSON's decoding. It asks for no gzip
// (rest.Config.DisableCompression): a client in the cluster talks to its
// API server over a fast network, where compressing every watch event and
// large list costs the API server more CPU than the bytes are worth
// (measured in the e2e scale rig: gzip of the replicas' pod watches was
// about 6 % of kube-apiserver's CPU while servers were created; client-go
// applies it to TLS connections, the only kind an API server serves in
// practice). It reads files only and contacts nothing.
func (k Kube) RESTConfig(userAgent string) (*rest.Config, error) {
	var rc *rest.Config
	var err error
	if k.Kubeconfig == "" {
		rc, err = rest.InClusterConfig()
	} else {
		rc, err = clientcmd.BuildConfigFromFlags("", k.Kubeconfig)
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes client config: %w", err)
	}
	rc.UserAgent = userAgent
	rc.QPS, rc.Burst = float32(k.QPS), k.Burst
	rc.ContentType = runtime.ContentTypeProtobuf
	rc.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	rc.DisableCompression = true
	return rc, nil
}

// Where names the API server for messages: the kubeconfig's server URL,
// "in-cluster" without one, or the kubeconfig's path when it cannot be read.
func (k Kube) Where() string {
	if k.Kubeconfig == "" {
		return "in-cluster"
	}
	rc, err := clientcmd.BuildConfigFromFlags("", k.Kubeconfig)
	if err != nil {
		return k.Kubeconfig
	}
	return rc.Host
}

// Clientset builds a clientset (RESTConfig's errors); it contacts nothing.
func (k Kube) Clientset(userAgent string) (kubernetes.Interface, error) {
	rc, err := k.RESTConfig(userAgent)
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return cs, nil
}
