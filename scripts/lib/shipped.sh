# The binaries plexus ships (the image carries them, scripts/install.sh installs them): the
# workspace makes test helpers too, which are not among them. One list, sourced by
# build-release.sh (which builds these), build-image.sh, install.sh and arm64-check.sh (which
# checks the image holds exactly these).
# shellcheck disable=SC2034
SHIPPED=(plexus plexus-macvlan plexus-host-device plexus-ipam plexusctl plexus-daemon)
# The cargo arguments that build exactly them: the workspace's packages all selected, so that
# features unify as in every other build of the workspace and no dependency builds twice.
SHIPPED_BUILD=(--workspace)
for shipped_bin in "${SHIPPED[@]}"; do SHIPPED_BUILD+=(--bin "$shipped_bin"); done
