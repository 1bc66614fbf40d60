// Package render renders the gpubroker Helm chart (deploy/helm/gpubroker)
// with the Helm Go SDK, as `helm install --dry-run` or `helm template` would,
// for tests: values merged over the chart's values.yaml, checked against
// values.schema.json, the templates rendered for a release and sorted in
// Helm's install order, and the objects decoded.
//
// It links the Helm SDK (helm.sh/helm/v3), which is heavy: only tests import
// this package, and broker/cmd/gpubroker's binary test keeps it out of the
// production broker.
//
// The chart is found relative to this source file, so tests of any package
// render the same chart from a checkout.
package render
