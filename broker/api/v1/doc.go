// Package v1 holds the JSON wire types of the gpubroker REST API (/api/v1) and
// the names that the broker, the spawner, the limiter and the frontend share:
// pod environment variables, labels, annotations and in-pod paths.
//
// It depends on the standard library only, so every part may import it. A
// change here is a contract change: update ARCHITECTURE.md's counterpart,
// the OpenAPI document (broker/internal/httpapi/openapi.yaml) and the README
// in the same commit.
package v1
