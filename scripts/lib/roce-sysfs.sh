# roce_sysfs DIR NAME...: a fake sysfs in DIR that makes each named netdev a ConnectX function for
# plexus (this kernel has no PCI NICs and no RDMA): the ports spread over 8 PCIe roots in order
# (NUMA node 0 for the first four, 1 for the others), each function with its RDMA device
# (mlx5_N) and uverbs node. What plexus reads through PLEXUS_SYSFS_ROOT / --sysfs-root; the
# netdevs themselves are real (veths).
roce_sysfs() {
  local sys=$1 n=0 ports root fn slot bus pci dev name
  shift
  ports=$#
  for name in "$@"; do
    root=$((n * 8 / ports)) fn=$((n % 8)) slot=$(((n / 8) % 32))
    bus=$(printf '%02x' $((0x10 * (root + 1) + 1)))
    pci=$(printf '0000:%s:%02x.%d' "$bus" "$slot" "$fn")
    dev=$sys/devices/pci0000:$(printf '%02x' $((0x10 * (root + 1))))/$pci
    mkdir -p "$dev/net/$name" "$dev/infiniband/mlx5_$n" "$dev/infiniband_verbs/uverbs$n" "$sys/bus/pci/devices" "$sys/class/net/$name"
    echo $((root / 4)) > "$dev/numa_node"
    ln -s "$dev" "$sys/bus/pci/devices/$pci"
    ln -s "$dev" "$sys/class/net/$name/device"
    n=$((n + 1))
  done
}
