#!/usr/bin/env bash
# Writes the plain manifests in conf-examples/deploy/ from the Helm chart (deploy/helm/plexus), so
# the two never disagree: thin/ and daemon/ (each a kustomization: `kubectl apply -k`, the image
# set with kustomize's `images:`), crd/, rbac-ipam-kubernetes.yaml and rbac-ipam-pools.yaml. The chart is the one place
# they are written; a test renders them again and compares.
#
#   bash scripts/render-manifests.sh            # rewrite conf-examples/deploy
#   bash scripts/render-manifests.sh DIR        # write them under DIR instead
#
# helm comes from scripts/peers.sh (built from its Go module). Rendered without the chart's hooks:
# plain manifests have no pre-delete step, so uninstalling them is two commands (README).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-conf-examples/deploy}
helm=$(bash scripts/peers.sh)/helm
chart=deploy/helm/plexus
render() {
  "$helm" template plexus "$chart" --namespace kube-system --no-hooks "$@" |
    grep -v -e '^# Source: ' -e 'app.kubernetes.io/managed-by: ' -e 'helm.sh/chart: ' |
    sed -e '/^---$/N;s/^---\n$/---/'
}
header() {
  echo "# Generated from deploy/helm/plexus by scripts/render-manifests.sh (helm template $*): edit the chart."
}
mkdir -p "$out/crd" "$out/thin" "$out/daemon"
{ header "crds/"; cat "$chart/crds/network-attachment-definitions.yaml"; } > "$out/crd/crd.yaml"
printf 'resources:\n- crd.yaml\n' > "$out/crd/kustomization.yaml"
for mode in thin daemon; do
  { header "--set mode=$mode"; render --set "mode=$mode"; } > "$out/$mode/plexus.yaml"
  cat > "$out/$mode/kustomization.yaml" << KUST
# kubectl apply -k conf-examples/deploy/$mode — or, in a kustomization of your own, this directory
# as a resource and your registry's image:
#   images: [{name: localhost/plexus, newName: registry.example/plexus, newTag: "0.1.0"}]
resources:
- ../crd
- plexus.yaml
KUST
done
{ header "--show-only templates/rbac-ipam-kubernetes.yaml --set ipamKubernetesStore.enabled=true"
  render --show-only templates/rbac-ipam-kubernetes.yaml --set ipamKubernetesStore.enabled=true; } > "$out/rbac-ipam-kubernetes.yaml"
{ header "--show-only templates/rbac-ipam-pools.yaml --set ipamPools.enabled=true"
  render --show-only templates/rbac-ipam-pools.yaml --set ipamPools.enabled=true; } > "$out/rbac-ipam-pools.yaml"
