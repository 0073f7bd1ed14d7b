# The binaries plexus ships (the image carries them, scripts/install.sh installs them): the
# release build makes test helpers too, which are not among them. One list, sourced by
# build-image.sh, install.sh and arm64-check.sh (which checks the image holds exactly these).
# shellcheck disable=SC2034
SHIPPED=(plexus plexus-macvlan plexus-host-device plexus-ipam plexusctl plexus-daemon)
