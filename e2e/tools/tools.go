//go:build tools

// Package tools pins the command-line tools the e2e harness builds.
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
