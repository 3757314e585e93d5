#!/usr/bin/env bash
# A one-node SLURM cluster on this machine for tests/test_slurm*.py: `cluster.sh start` writes its
# slurm.conf into $CL2R_SLURM_DIR (default /tmp/cl2r-slurm) and starts munged, slurmctld and slurmd; `cluster.sh
# stop` cancels every job, waits for an empty queue and stops the daemons. Needs root and Debian's slurm-wlm
# (apt-get install -y slurm-wlm). The clients find the cluster with SLURM_CONF=$CL2R_SLURM_DIR/slurm.conf, so a
# real cluster's /etc/slurm is never touched.
#
# What a container needs (found on the CI machine): RealMemory from /proc/meminfo (a node without it has 1 MB and
# refuses submitit's jobs), proctrack/linuxproc and task/none (no cgroups), no accounting (no slurmdbd; so a
# cancelled job never counts as done for submitit), and a short KillWait with an empty queue before stopping, or
# slurmd takes minutes to stop. A requeued job waits cred_expire + 1 s before it starts again (a job started earlier
# is killed, "Job credential revoked"): 10 s here instead of 120 s, and the scheduler looks for startable jobs every
# 2 s instead of every 30-60 s. A slurmd whose first registration fails retries only after about 30 s, then 60 s
# (seen once in CI: the node was not idle after 30 s), so a node not idle in 15 s is resumed and its slurmd
# restarted, and a node that stays down prints its state and the daemons' logs. A cluster is started with empty
# state and spool folders: a run killed before `stop` (seen in CI) leaves an allocated job that slurmctld would
# recover, and the node then never becomes idle. The node offers at least 4 CPUs whatever the machine has
# (SlurmdParameters=config_overrides): the time-limit tests' two jobs spend their time waiting, and with slots
# for two more the other tests' jobs never queue behind them.
set -euo pipefail

DIR=${CL2R_SLURM_DIR:-/tmp/cl2r-slurm}
export SLURM_CONF=$DIR/slurm.conf

write_conf() {
    local memory
    memory=$(awk '/^MemTotal:/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
    rm -rf "$DIR/state" "$DIR/spool"
    mkdir -p "$DIR/state" "$DIR/spool"
    cat > "$SLURM_CONF" <<CONF
ClusterName=cl2rtest
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=10
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
MpiDefault=none
ReturnToService=2
KillWait=2
SlurmdParameters=config_overrides
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$(( $(nproc) > 4 ? $(nproc) : 4 )) RealMemory=$memory State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF
}

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...: until COMMAND succeeds
    local seconds=$1 what=$2
    shift 2
    for _ in $(seq $((seconds * 4))); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.25
    done
    echo "cluster.sh: $what after ${seconds} s; see $DIR/*.log" >&2
    return 1
}

node_idle() { [ "$(sinfo -h -n localhost -o %t)" = idle ]; }
queue_empty() { [ -z "$(squeue -h -o %i)" ]; }

start_node() {  # slurmd registered and the node idle, restarting slurmd once if it is not
    slurmd -f "$SLURM_CONF"
    wait_for 15 "the node is not idle" node_idle && return 0
    scontrol update NodeName=localhost State=RESUME >/dev/null 2>&1 || true
    stop_daemon slurmd
    slurmd -f "$SLURM_CONF"
    wait_for 60 "the node is still not idle after restarting slurmd" node_idle
}

show_node_state() {
    scontrol show node localhost 2>&1 | grep -E 'State=|Reason=' >&2 || true
    for log in "$DIR/slurmctld.log" "$DIR/slurmd.log"; do
        echo "--- last lines of $log" >&2
        tail -n 15 "$log" >&2 || true
    done
}

stop_daemon() {  # stop_daemon NAME: kill the daemon started from $DIR and wait until it is gone
    local pid
    [ -f "$DIR/$1.pid" ] || return 0
    pid=$(cat "$DIR/$1.pid")
    kill "$pid" 2>/dev/null || true
    wait_for 30 "$1 does not stop" bash -c "! kill -0 $pid" || true
    rm -f "$DIR/$1.pid"
}

start() {
    command -v slurmctld >/dev/null || { echo "cluster.sh: no slurmctld; apt-get install -y slurm-wlm" >&2; exit 1; }
    if [ -f "$SLURM_CONF" ] && sinfo >/dev/null 2>&1; then
        echo "SLURM is already up: export SLURM_CONF=$SLURM_CONF"
        return 0
    fi
    write_conf
    if ! pgrep -x munged >/dev/null; then
        [ -s /etc/munge/munge.key ] || { mungekey --create --force; chown munge:munge /etc/munge/munge.key; }
        mkdir -p /run/munge && chown munge:munge /run/munge
        runuser -u munge -- /usr/sbin/munged
        touch "$DIR/munged.ours"
    fi
    slurmctld -f "$SLURM_CONF"
    wait_for 30 "slurmctld does not answer" sinfo
    start_node || { show_node_state; exit 1; }
    echo "SLURM is up: export SLURM_CONF=$SLURM_CONF"
}

stop() {
    [ -f "$SLURM_CONF" ] || return 0
    if sinfo >/dev/null 2>&1; then
        scancel --full --user "$(id -un)" 2>/dev/null || true
        wait_for 60 "jobs still in the queue" queue_empty || true
    fi
    stop_daemon slurmd
    stop_daemon slurmctld
    if [ -f "$DIR/munged.ours" ]; then
        runuser -u munge -- /usr/sbin/munged --stop >/dev/null 2>&1 || true
        rm -f "$DIR/munged.ours"
    fi
    echo "SLURM is stopped"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
