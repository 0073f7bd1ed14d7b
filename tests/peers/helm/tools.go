//go:build tools

// helm, to install, upgrade and uninstall plexus's chart on the real node. Built by scripts/peers.sh.
package tools

import _ "helm.sh/helm/v4/cmd/helm"
