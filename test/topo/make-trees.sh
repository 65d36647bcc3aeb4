#!/usr/bin/env bash
# Writes the fake sysfs trees the topology tests read (committed beside
# this script; rerun it after changing a layout):
#   dgx-h100    2 sockets, 4 PCIe switches, each with 2 H100s and 2 CX7 NICs
#               (NIC names deliberately out of PCI order), plus a storage
#               NIC whose port is down
#   fewer-nics  the same GPUs, one NIC on switch 0 and one on switch 2
#   empty       no GPU and no RDMA device (an Ethernet function only)
# Each mirrors the kernel's layout: /sys/devices/pci*/... with vendor,
# class and numa_node files, /sys/bus/pci/devices and /sys/class/infiniband
# as symbolic links.
# SPDX-License-Identifier: MIT
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

# dev ROOT PATH VENDOR CLASS NUMA: a PCI function at /sys/devices/PATH.
dev() {
    local root=$1 path=$2 d
    d=$root/sys/devices/$path
    mkdir -p "$d" "$root/sys/bus/pci/devices"
    echo "$3" >"$d/vendor"
    echo "$4" >"$d/class"
    echo "$5" >"$d/numa_node"
    ln -sfn "../../../devices/$path" "$root/sys/bus/pci/devices/$(basename "$path")"
}

# nic ROOT PATH NAME STATE RATE LINK NUMA GUID
nic() {
    local root=$1 path=$2 name=$3 d
    dev "$root" "$path" 0x15b3 0x020700 "$7"
    d=$root/sys/devices/$path/infiniband/$name
    mkdir -p "$d/ports/1" "$root/sys/class/infiniband"
    echo "$8" >"$d/node_guid"
    echo "$4" >"$d/ports/1/state"
    echo "$5" >"$d/ports/1/rate"
    echo "$6" >"$d/ports/1/link_layer"
    ln -sfn "../../../$(basename "$path")" "$d/device"
    ln -sfn "../../devices/$path/infiniband/$name" "$root/sys/class/infiniband/$name"
}

# A switch below host bridge HB (hex), socket NUMA: root port, upstream
# port, four downstream ports; prints the downstream ports' paths.
switch_ports() {
    local hb=$1 numa=$2 root=$3 b=$((16#$1)) rp up i
    rp=pci0000:$hb/0000:$hb:01.0
    up=$rp/$(printf '0000:%02x:00.0' $((b + 1)))
    dev "$root" "$rp" 0x8086 0x060400 "$numa"
    dev "$root" "$up" 0x1000 0x060400 "$numa"
    for i in 0 1 2 3; do
        dev "$root" "$up/$(printf '0000:%02x:%02x.0' $((b + 2)) $i)" 0x1000 0x060400 "$numa"
        echo "$up/$(printf '0000:%02x:%02x.0' $((b + 2)) $i)"
    done
}

ndr="400 Gb/sec (4X NDR)"
gpu() { dev "$1" "$2/$(printf '0000:%02x:00.0' "$3")" 0x10de 0x030200 "$4"; }
nic_at() {
    nic "$1" "$2/$(printf '0000:%02x:00.0' "$3")" "$4" "$5" "$ndr" InfiniBand "$6" \
        "$(printf 'a088:c203:00%02x:%04x' "$3" "$3")"
}

make_tree() { # NAME NICS-PER-SWITCH-SPEC
    local root=$here/$1 s hb numa b ports
    rm -rf "$root"
    mkdir -p "$root/sys"
    for s in 0 1 2 3; do
        hb=$(printf '%02x' $((s * 32 + (s >= 2 ? 64 : 0))))
        numa=$((s / 2))
        b=$((16#$hb))
        mapfile -t ports < <(switch_ports "$hb" "$numa" "$root")
        gpu "$root" "${ports[0]}" $((b + 3)) "$numa"
        gpu "$root" "${ports[1]}" $((b + 4)) "$numa"
        "$2" "$root" "$s" "$b" "$numa" "${ports[2]}" "${ports[3]}"
    done
}

# Names out of PCI order on switches 1 and 3: the rail follows the bus.
dgx_nics() {
    local names=(mlx5_0 mlx5_1 mlx5_3 mlx5_2 mlx5_4 mlx5_5 mlx5_7 mlx5_6)
    nic_at "$1" "$5" $(($3 + 5)) "${names[$((2 * $2))]}" "4: ACTIVE" "$4"
    nic_at "$1" "$6" $(($3 + 6)) "${names[$((2 * $2 + 1))]}" "4: ACTIVE" "$4"
}
few_nics() {
    if [ "$2" = 0 ] || [ "$2" = 2 ]; then
        nic_at "$1" "$5" $(($3 + 5)) "mlx5_$(($2 / 2))" "4: ACTIVE" "$4"
    fi
}

make_tree dgx-h100 dgx_nics
# The storage NIC: on socket 0's own host bridge, its port down.
dev "$here/dgx-h100" pci0000:10/0000:10:01.0 0x8086 0x060400 0
nic "$here/dgx-h100" pci0000:10/0000:10:01.0/0000:11:00.0 mlx5_8 "1: DOWN" \
    "100 Gb/sec (4X EDR)" Ethernet 0 a088:c203:0011:0011
make_tree fewer-nics few_nics

rm -rf "$here/empty"
dev "$here/empty" pci0000:00/0000:00:1f.6 0x8086 0x020000 0
echo "trees written under $here"
