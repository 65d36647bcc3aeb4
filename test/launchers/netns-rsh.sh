#!/bin/sh
# Open MPI's rsh agent (plm_rsh_agent) for the simulated nodes of
# tools/lab/netns-lib.sh: host 198.18.0.(i+1) is namespace ${NETNS_TAG}n$i, so
# mpirun starts its orted there as ssh would on a real node.
#   netns-rsh.sh HOST COMMAND...   SPDX-License-Identifier: MIT
host=$1
shift
case $host in
198.18.0.[1-9]*) ;;
*) echo "netns-rsh: $host is not a simulated node (198.18.0.N)" >&2; exit 255 ;;
esac
exec ip netns exec "${NETNS_TAG:?}n$((${host##*.} - 1))" sh -c "$*"
