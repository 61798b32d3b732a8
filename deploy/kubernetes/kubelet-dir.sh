#!/bin/sh
# The manifests for a kubelet whose root is not /var/lib/kubelet (MicroK8s, k0s, some
# managed distributions), on stdout:
#   deploy/kubernetes/kubelet-dir.sh /var/snap/microk8s/common/var/lib/kubelet | kubectl apply -f -
# The plugin's socket, the registration path and the pods' volume mounts all live under
# kubelet's root, and the container sees it at the same path as the host (kubelet hands
# the plugin host paths), so every occurrence changes together.
set -eu
dir=${1:?usage: kubelet-dir.sh KUBELET_ROOT_DIR}
case $dir in /*) ;; *) echo "kubelet-dir.sh: $dir: an absolute path" >&2; exit 2 ;; esac
here=$(dirname "$0")
for f in csidriver.yaml rbac.yaml daemonset.yaml; do
  echo ---
  sed "s#/var/lib/kubelet#${dir%/}#g" "$here/$f"
done
