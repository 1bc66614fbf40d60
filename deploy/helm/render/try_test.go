package render

import (
	"fmt"
	"testing"

	"sigs.k8s.io/yaml"
)

func TestTry(t *testing.T) {
	r, err := Render(Options{Values: []string{`
broker: {oidc: {issuer: "https://idp.example.org/realms/x", audience: gpubroker}}
notebooks: {domain: nb.example.org}
redis: {url: "redis://redis:6379/0"}
ingress: {enabled: true, host: gpubroker.example.org}
monitoring: {serviceMonitor: {enabled: true}, prometheusRule: {enabled: true}, dashboard: {enabled: true}}
`}})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range r.Objects {
		b, _ := yaml.Marshal(o.Object)
		fmt.Printf("---\n%s", b)
	}
	fmt.Println(r.Notes)
}
