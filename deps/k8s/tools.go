//go:build tools

// Package k8s pins the upstream Kubernetes control plane and etcd that the real-cluster test tier
// runs (docs/real-cluster.md). Nothing here is compiled into multilane: scripts/k8s-binaries.sh
// builds the main packages below from this module, so go.mod and go.sum fix every version.
package k8s

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
