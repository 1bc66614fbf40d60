package cliconfig

import (
	"fmt"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Kube is how a binary reaches the Kubernetes API server.
type Kube struct {
	// Kubeconfig is a kubeconfig path; "" means the pod's in-cluster config
	// (its service account).
	Kubeconfig string
}

// Flags returns the Kubernetes flags bound to k: --kubeconfig, whose
// default the help and README show as kubeconfigDefault.
func (k *Kube) Flags(kubeconfigDefault string) []Flag {
	return []Flag{
		{Name: "kubeconfig", Placeholder: "PATH", Value: String(&k.Kubeconfig), DefaultDoc: kubeconfigDefault,
			Help:  "Kubeconfig file naming the Kubernetes API server and the credentials for it.",
			Check: func() error { return checkOptionalFile(k.Kubeconfig) }},
	}
}

// RESTConfig builds the client configuration from Kubeconfig, or from the
// in-cluster service account when it is "", with userAgent set. It reads
// files only and contacts nothing.
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
