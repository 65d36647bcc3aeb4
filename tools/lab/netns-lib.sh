# Simulated nodes for stagelink's scripts: one network namespace per node,
# joined by a veth pair (two nodes) or through a bridge (more), addresses
# 198.18.0.(i+1), links optionally rate-limited with tc tbf ($rate), each
# delivering in order (64 KiB frames through veth's NAPI ring), TCP between
# nodes under congestion control $link_cc (default cubic).  Sourced
# by stagelink_two_node.sh and bench-two-node; they set $run (stagelink_run)
# and $rate first.  Everything made is removed on any exit.
# SPDX-License-Identifier: MIT
case "$0" in *netns-lib.sh) case "${1:-}" in -h|--help)
    echo "usage: run=STAGELINK_RUN rate=RATE; . netns-lib.sh    (a library of simulated nodes: sourced, not run)"
    exit 0 ;; esac ;; esac

skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root to create network namespaces (ip netns)"
command -v ip >/dev/null || skip "iproute2 (ip) is not installed"
command -v ethtool >/dev/null || skip "ethtool is not installed"

tag=sl$$
ns=()
# The link stands for an RDMA fabric, so TCP's congestion control is the
# simulation's own: Linux's default, cubic, whatever this host's default is.
# bbr paces each flow by timer, and on two shared cores that cost t = 4's
# four flows a tenth of the link (docs/performance.md).
link_cc=${link_cc:-cubic}
cleanup() {
    local n
    for n in "${ns[@]}"; do ip netns del "$n" 2>/dev/null || true; done
    ip netns del "${tag}hub" 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A link that delivers each flow in order, as an RDMA fabric does.  veth
# hands a TSO frame to the backlog of whichever CPU dequeued it from tbf,
# so two CPUs reorder one flow, and TCP then retransmits what had arrived
# and stalls (docs/performance.md).  Without TSO a frame takes veth's NAPI
# ring, one consumer at a time; 64 KiB frames (IPoIB connected mode's
# size) keep the packets per byte as few as TSO's.
in_order() {
    ip -n "$1" link set "$2" mtu 65535
    ip netns exec "$1" ethtool -K "$2" tso off gro on >/dev/null
}

# Node i gets namespace ${tag}n$i, link ${tag}e$i and address 198.18.0.(i+1).
setup_nodes() {
    local count=$1 i n w
    if ! err=$(ip netns add "${tag}n0" 2>&1); then
        skip "cannot create a network namespace: $err"
    fi
    ns+=("${tag}n0")
    for ((i = 1; i < count; i++)); do
        ip netns add "${tag}n$i"
        ns+=("${tag}n$i")
    done
    if [ "$count" = 2 ]; then
        ip link add "${tag}e0" netns "${tag}n0" type veth \
            peer name "${tag}e1" netns "${tag}n1"
    else
        ip netns add "${tag}hub"
        ip -n "${tag}hub" link add br0 type bridge
        ip -n "${tag}hub" link set br0 up
        for ((i = 0; i < count; i++)); do
            ip link add "${tag}e$i" netns "${tag}n$i" type veth \
                peer name "${tag}h$i" netns "${tag}hub"
            ip -n "${tag}hub" link set "${tag}h$i" master br0 up
            in_order "${tag}hub" "${tag}h$i"
        done
    fi
    for ((i = 0; i < count; i++)); do
        n=${tag}n$i
        in_order "$n" "${tag}e$i"
        ip -n "$n" link set lo up
        ip -n "$n" addr add "198.18.0.$((i + 1))/24" dev "${tag}e$i"
        ip -n "$n" link set "${tag}e$i" up
        if ! err=$(ip -n "$n" route replace 198.18.0.0/24 dev "${tag}e$i" \
                   congctl "$link_cc" 2>&1); then
            echo "FAIL: TCP congestion control $link_cc on the simulated link: $err" \
                 "(available: $(cat /proc/sys/net/ipv4/tcp_available_congestion_control))" >&2
            return 1
        fi
        if [ -n "$rate" ]; then
            ip netns exec "$n" tc qdisc add dev "${tag}e$i" root tbf \
                rate "$rate" burst 1mbit latency 50ms
        fi
    done
    # UCX lists only running interfaces: wait for the carrier (at most 10 s).
    for ((i = 0; i < count; i++)); do
        for ((w = 0; w < 100; w++)); do
            [ "$(ip netns exec "${tag}n$i" cat "/sys/class/net/${tag}e$i/operstate")" = up ] && break
            sleep 0.1
        done
    done
}

# Bytes that crossed between nodes: each node's link, transmit side.
crossed() {
    local total=0 i v
    for ((i = 0; i < ${#ns[@]}; i++)); do
        v=$(ip netns exec "${ns[$i]}" cat "/sys/class/net/${tag}e$i/statistics/tx_bytes")
        total=$((total + v))
    done
    echo "$total"
}

# An nstat TCP counter summed over the nodes: TcpRetransSegs (segments
# sent again), TcpExtTCPDSACKRecvSegs (of those, the ones the receiver
# reported it already had: spurious, not lost).
tcp_count() {
    local total=0 i v
    for ((i = 0; i < ${#ns[@]}; i++)); do
        v=$(ip netns exec "${ns[$i]}" nstat -asz "$1" | awk -v c="$1" '$1 == c {print $2}')
        total=$((total + ${v:-0}))
    done
    echo "$total"
}

# Starts ranks_per_node ranks on every node, each node by its own command.
run_job() {
    local per=$1 i pids=() rc=0
    shift
    MASTER_PORT=$(ip netns exec "${ns[0]}" "$run" -P) || return 1
    export MASTER_ADDR=198.18.0.1 MASTER_PORT
    # One secret for every node's ranks, as a batch script would export it.
    if [ -z "${STAGELINK_JOB_SECRET_FILE:-}" ]; then
        export STAGELINK_JOB_SECRET=${STAGELINK_JOB_SECRET:-$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')}
    fi
    # Each node's own link for gloo and NCCL's sockets: a namespace's
    # hostname resolves to loopback, which the other nodes cannot reach.
    for ((i = 0; i < ${#ns[@]}; i++)); do
        GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-${tag}e$i} \
        NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-${tag}e$i} \
            ip netns exec "${ns[$i]}" "$run" -n "$per" -o $((i * per)) \
            -w $((per * ${#ns[@]})) -T 240 -- "$@" &
        pids+=($!)
    done
    for i in "${pids[@]}"; do wait "$i" || rc=1; done
    return $rc
}


# ucx_perftest_row BYTES TEST ITERS DIR: ucx_perftest TEST (tag_bw or
# tag_lat) from node 0 to node 1 over the link only (UCX_TLS=tcp), as the
# CSV row "bytes,test,bw_MBps,lat_us,cpu_s_per_GB": both processes' CPU
# time (user + system) from the kernel; the server waited for by its
# listening port.  DIR holds the time files.
ucx_perftest_row() {
    local n=$1 t=$2 k=$3 dir=$4 srv line cpu
    ip netns exec "${ns[1]}" env UCX_TLS=tcp,self UCX_NET_DEVICES="${tag}e1" \
        /usr/bin/time -f "%U %S" -o "$dir/ucx.cpu.srv" \
        timeout 120 ucx_perftest -p 13370 >/dev/null 2>&1 &
    srv=$!
    for _ in $(seq 200); do
        ip netns exec "${ns[1]}" ss -ltn | grep -q ":13370 " && break
        sleep 0.05
    done
    line=$(ip netns exec "${ns[0]}" env UCX_TLS=tcp,self UCX_NET_DEVICES="${tag}e0" \
        /usr/bin/time -f "%U %S" -o "$dir/ucx.cpu.cli" \
        timeout 120 ucx_perftest 198.18.0.2 -p 13370 -t "$t" -s "$n" \
        -n "$k" 2>/dev/null | grep Final: || true)
    wait "$srv" 2>/dev/null || true
    cpu=$(cat "$dir/ucx.cpu.srv" "$dir/ucx.cpu.cli" 2>/dev/null |
          awk 'NF == 2 && $1 ~ /^[0-9.]+$/ {c += $1 + $2} END {print c + 0}')
    # Final: iters lat_p50 lat_avg lat_overall bw_avg(MiB/s) bw_overall ...
    # tag_lat moves each message both ways.
    echo "$line" | awk -v n="$n" -v t="$t" -v c="$cpu" -v k="$k" \
        '{printf "%s,%s,%s,%s,%.4f\n", n, t, $6, $4, c / (k * n * (t == "tag_lat" ? 2 : 1) / 1e9)}'
}

bytes() { # 16M -> 16777216
    awk -v s="$1" 'BEGIN{m=1; u=substr(s,length(s)); if(u=="K")m=1024; if(u=="M")m=1048576; if(u=="G")m=1073741824; if(m>1)s=substr(s,1,length(s)-1); print s*m}'
}
