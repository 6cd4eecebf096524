//go:build tools

// Package helm pins the Helm CLI that the real-cluster test tier installs the chart with
// (docs/real-cluster.md). Nothing here is compiled into multilane: scripts/k8s-binaries.sh builds
// helm.sh/helm/v3/cmd/helm from this module, so go.mod and go.sum fix every version.
//
// It is a module of its own, beside deps/k8s: Helm v3.19 requires newer golang.org/x modules than
// Kubernetes v1.34.4 does, and one module would move the control plane's pins (and rebuild it).
package helm

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
