# A one-node Slurm of the test's own, sourced by test/launchers/run.sh:
# munged, slurmctld and slurmd as root with a config, ports, state folders
# and munge socket under DIR, the node named by the hostname.
# slurm_start DIR waits until sinfo shows the node idle; slurm_stop DIR
# ends the daemons by their pid files.  SPDX-License-Identifier: MIT

slurm_start() {
    local dir=$1 host ports i
    host=$(hostname)
    mkdir -p "$dir/ctld" "$dir/spool"
    # Two ports below the ephemeral range, free now (stagelink_run -P).
    ports="$("$run" -P) $("$run" -P)"
    set -- $ports
    head -c 1024 /dev/urandom >"$dir/munge.key"
    chmod 400 "$dir/munge.key"
    cat >"$dir/slurm.conf" <<CONF
ClusterName=stagelink
SlurmctldHost=$host
SlurmctldPort=$1
SlurmdPort=$2
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SchedulerType=sched/builtin
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName=$host CPUs=8 RealMemory=1000 State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
    export SLURM_CONF=$dir/slurm.conf
    munged --socket="$dir/munge.socket" --key-file="$dir/munge.key" \
        --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" \
        --seed-file="$dir/munge.seed" --force || return 1
    slurmctld -f "$SLURM_CONF" || return 1
    slurmd -f "$SLURM_CONF" || return 1
    # The node registers in about a second; 60 s bounds a broken setup.
    for i in $(seq 300); do
        [ "$(sinfo -h -o %T 2>/dev/null)" = idle ] && return 0
        sleep 0.2
    done
    echo "slurm: the node did not become idle in 60 s:" >&2
    sinfo >&2 || true
    tail -5 "$dir/slurmctld.log" "$dir/slurmd.log" >&2
    return 1
}

slurm_stop() {
    local dir=$1 d pid i
    for d in slurmd slurmctld munged; do
        [ -s "$dir/$d.pid" ] || continue
        pid=$(cat "$dir/$d.pid")
        kill "$pid" 2>/dev/null || continue
        for i in $(seq 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -9 "$pid" 2>/dev/null || true
    done
}
