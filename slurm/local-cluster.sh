#!/usr/bin/env bash
# A private single-node SLURM on loopback, for dask_rpm's tests and demos.
#
#   slurm/local-cluster.sh start    install (if needed) and start munged, slurmctld, slurmd
#   slurm/local-cluster.sh stop     cancel all jobs of this cluster and stop its daemons
#   slurm/local-cluster.sh status   show the daemons, sinfo and squeue
#
# Everything lives in one state directory (default /tmp/dask-rpm-slurm, override
# with DASK_RPM_SLURM_DIR): slurm.conf, a private munge key and socket, logs,
# pid files, spool and state. Ports are non-default so a site SLURM, if any, is
# left alone. After `start`, point the SLURM client commands at this cluster:
#
#   export SLURM_CONF=/tmp/dask-rpm-slurm/slurm.conf
#
# The one node carries two partitions, `fast` and `slow`, standing for two node
# types. The node declares more CPUs and memory than the machine has
# (SlurmdParameters=config_overrides) so that several small worker jobs run at
# once on a laptop or a CI runner. Nothing is enforced (no cgroups): it is a
# scheduler for tests, not for isolation.
#
# Settings (environment variables, all optional):
#   DASK_RPM_SLURM_DIR         state directory              (/tmp/dask-rpm-slurm)
#   DASK_RPM_SLURM_CTLD_PORT   slurmctld port               (16817)
#   DASK_RPM_SLURM_D_PORT      slurmd port                  (16818)
#   DASK_RPM_SLURM_CPUS        CPUs the node declares       (16)
#   DASK_RPM_SLURM_MEM_MB      RealMemory the node declares (32768)
#   DASK_RPM_SLURM_PARTITIONS  partition names, first is the default ("fast slow")
#   DASK_RPM_SLURM_TIMEOUT     seconds `start` waits for the node to be idle (60)
set -euo pipefail

DIR=${DASK_RPM_SLURM_DIR:-/tmp/dask-rpm-slurm}
CTLD_PORT=${DASK_RPM_SLURM_CTLD_PORT:-16817}
SLURMD_PORT=${DASK_RPM_SLURM_D_PORT:-16818}
CPUS=${DASK_RPM_SLURM_CPUS:-16}
MEM_MB=${DASK_RPM_SLURM_MEM_MB:-32768}
PARTITIONS=${DASK_RPM_SLURM_PARTITIONS:-fast slow}
TIMEOUT=${DASK_RPM_SLURM_TIMEOUT:-60}

CONF="$DIR/slurm.conf"
MUNGE_DIR="$DIR/munge"
MUNGE_SOCKET="$MUNGE_DIR/munge.socket"
LOG_DIR="$DIR/log"
RUN_DIR="$DIR/run"
# Short host name: slurmd must find its own NodeName; the address is pinned to
# loopback so no DNS or real network is needed.
NODE=$(hostname -s 2>/dev/null || hostname)

PROG=$(basename "$0")

die() {
    echo "$PROG: error: $*" >&2
    exit 1
}

info() {
    echo "$PROG: $*"
}

# True when the pid in file $1 is alive and its command is $2. Checking the
# command guards against a stale pid file whose pid was reused.
alive() {
    local pidfile=$1 name=$2 pid
    [[ -s $pidfile ]] || return 1
    pid=$(<"$pidfile")
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    kill -0 "$pid" 2>/dev/null || return 1
    [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$name" ]]
}

# Send TERM to the daemon in pid file $1 (command $2), wait, then KILL.
stop_daemon() {
    local pidfile=$1 name=$2 pid i
    if ! alive "$pidfile" "$name"; then
        rm -f "$pidfile"
        return 0
    fi
    pid=$(<"$pidfile")
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.2
    done
    if kill -0 "$pid" 2>/dev/null; then
        info "$name (pid $pid) ignored TERM; sending KILL"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$pidfile"
    info "stopped $name"
}

show_logs() {
    local f
    for f in "$LOG_DIR/slurmctld.log" "$LOG_DIR/slurmd.log" "$MUNGE_DIR/munged.log"; do
        if [[ -f $f ]]; then
            echo "----- last lines of $f -----" >&2
            tail -n 25 "$f" >&2
        fi
    done
}

ensure_installed() {
    local missing=()
    local cmd
    for cmd in slurmctld slurmd sinfo sbatch scancel squeue munged; do
        command -v "$cmd" >/dev/null 2>&1 || missing+=("$cmd")
    done
    ((${#missing[@]} == 0)) && return 0

    if ((EUID != 0)); then
        die "missing ${missing[*]}; installing them needs root. Run this script as root, or install the Debian packages yourself: apt-get install slurm-wlm munge"
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        die "missing ${missing[*]} and apt-get is not available; install SLURM (slurmctld, slurmd, client commands) and munge with your package manager, then rerun"
    fi
    info "installing slurm-wlm and munge with apt-get (missing: ${missing[*]})"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq || die "apt-get update failed; check the network or the apt sources"
    apt-get install -y -qq slurm-wlm munge >/dev/null ||
        die "apt-get install slurm-wlm munge failed"
    for cmd in "${missing[@]}"; do
        command -v "$cmd" >/dev/null 2>&1 || die "$cmd still missing after installing slurm-wlm and munge"
    done
}

write_conf() {
    local out=$1 first=1 p
    {
        echo "# Written by dask_rpm slurm/local-cluster.sh; regenerated on every start."
        echo "ClusterName=dask-rpm"
        echo "SlurmctldHost=$NODE(127.0.0.1)"
        echo "SlurmctldPort=$CTLD_PORT"
        echo "SlurmdPort=$SLURMD_PORT"
        echo "SlurmUser=root"
        echo "SlurmdUser=root"
        echo "AuthType=auth/munge"
        echo "CredType=cred/munge"
        echo "AuthInfo=socket=$MUNGE_SOCKET"
        echo "StateSaveLocation=$DIR/state"
        echo "SlurmdSpoolDir=$DIR/spool/slurmd"
        echo "SlurmctldPidFile=$RUN_DIR/slurmctld.pid"
        echo "SlurmdPidFile=$RUN_DIR/slurmd.pid"
        echo "SlurmctldLogFile=$LOG_DIR/slurmctld.log"
        echo "SlurmdLogFile=$LOG_DIR/slurmd.log"
        echo "SlurmctldDebug=info"
        echo "SlurmdDebug=info"
        # No cgroups in containers or CI runners: track processes by /proc,
        # do not bind tasks, gather no accounting.
        echo "ProctrackType=proctrack/linuxproc"
        echo "TaskPlugin=task/none"
        echo "JobAcctGatherType=jobacct_gather/none"
        echo "AccountingStorageType=accounting_storage/none"
        echo "JobCompType=jobcomp/none"
        echo "MpiDefault=none"
        echo "MailProg=/bin/true"
        echo "SwitchType=switch/none"
        # Count CPUs and memory so the declared node size bounds how many
        # worker jobs run at once.
        echo "SelectType=select/cons_tres"
        echo "SelectTypeParameters=CR_CPU_Memory"
        echo "SlurmdParameters=config_overrides"
        # Jobs without --mem would otherwise claim the whole node's memory.
        echo "DefMemPerCPU=1024"
        echo "ReturnToService=2"
        echo "SchedulerType=sched/backfill"
        echo "SchedulerParameters=sched_interval=1"
        echo "SlurmctldTimeout=30"
        echo "SlurmdTimeout=60"
        echo "InactiveLimit=0"
        echo "MinJobAge=30"
        echo "KillWait=5"
        echo "Waittime=0"
        echo "NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN"
        for p in $PARTITIONS; do
            if ((first)); then
                echo "PartitionName=$p Nodes=$NODE Default=YES MaxTime=INFINITE State=UP"
                first=0
            else
                echo "PartitionName=$p Nodes=$NODE Default=NO MaxTime=INFINITE State=UP"
            fi
        done
    } >"$out"
}

start_munged() {
    if alive "$MUNGE_DIR/munged.pid" munged; then
        return 0
    fi
    # A private key and socket: the machine's own munge (if any) is untouched
    # and nothing under /etc is needed.
    if [[ ! -s $MUNGE_DIR/munge.key ]]; then
        head -c 1024 /dev/urandom >"$MUNGE_DIR/munge.key"
    fi
    chmod 0400 "$MUNGE_DIR/munge.key"
    rm -f "$MUNGE_SOCKET" "$MUNGE_SOCKET.lock"
    munged 9>&- --key-file="$MUNGE_DIR/munge.key" \
        --socket="$MUNGE_SOCKET" \
        --pid-file="$MUNGE_DIR/munged.pid" \
        --log-file="$MUNGE_DIR/munged.log" \
        --seed-file="$MUNGE_DIR/munged.seed" ||
        { show_logs; die "munged failed to start"; }
    info "started munged (socket $MUNGE_SOCKET)"
}

start_slurmctld() {
    if alive "$RUN_DIR/slurmctld.pid" slurmctld; then
        return 0
    fi
    # -c: forget jobs from an earlier run; stale worker jobs are never wanted.
    slurmctld -c -f "$CONF" 9>&- || { show_logs; die "slurmctld failed to start"; }
    info "started slurmctld (port $CTLD_PORT)"
}

start_slurmd() {
    if alive "$RUN_DIR/slurmd.pid" slurmd; then
        return 0
    fi
    slurmd -f "$CONF" -N "$NODE" 9>&- || { show_logs; die "slurmd failed to start"; }
    info "started slurmd (port $SLURMD_PORT)"
}

# Wait until the node is up and usable (idle, or mixed/allocated when jobs are
# already running on a cluster that was started before).
wait_idle() {
    local deadline state resumed=0
    deadline=$((SECONDS + TIMEOUT))
    while ((SECONDS < deadline)); do
        state=$(sinfo -h -N -n "$NODE" -o %t 2>/dev/null | head -n 1 || true)
        case $state in
        idle | mix | alloc) return 0 ;;
        down* | drain* | drng*)
            # A node seen before a restart can come back "down"; bring it back once.
            if ((!resumed)); then
                scontrol update NodeName="$NODE" State=RESUME >/dev/null 2>&1 || true
                resumed=1
            fi
            ;;
        esac
        sleep 0.5
    done
    echo "$PROG: error: node $NODE did not become idle within ${TIMEOUT}s (last state: '${state:-no answer from slurmctld}')" >&2
    sinfo -N -l >&2 2>&1 || true
    show_logs
    exit 1
}

cmd_start() {
    if ((EUID != 0)); then
        die "must run as root: slurmd starts jobs as the submitting user, which needs root (you are $(id -un)). In CI run the tests as root; elsewhere use sudo"
    fi
    ensure_installed
    mkdir -p "$DIR" "$MUNGE_DIR" "$LOG_DIR" "$RUN_DIR" "$DIR/state" "$DIR/spool/slurmd" "$DIR/jobs"
    chmod 0755 "$MUNGE_DIR"  # munged: socket dir must be traversable by all
    export SLURM_CONF="$CONF"

    local running=0 new
    if alive "$RUN_DIR/slurmctld.pid" slurmctld || alive "$RUN_DIR/slurmd.pid" slurmd; then
        running=1
    fi
    new=$(mktemp "$DIR/slurm.conf.XXXXXX")
    write_conf "$new"
    if [[ -f $CONF ]] && ((running)) && ! cmp -s "$new" "$CONF"; then
        rm -f "$new"
        die "the settings changed while the cluster is running (see $CONF); run '$PROG stop' first"
    fi
    mv -f "$new" "$CONF"
    chmod 0644 "$CONF"

    start_munged
    start_slurmctld
    start_slurmd
    wait_idle
    info "node $NODE is up; partitions: $PARTITIONS"
    echo
    echo "Point SLURM commands (and dask_rpm) at this cluster with:"
    echo "  export SLURM_CONF=$CONF"
}

cmd_stop() {
    export SLURM_CONF="$CONF"
    if alive "$RUN_DIR/slurmctld.pid" slurmctld; then
        # Cancel jobs first: slurmd going away would orphan their processes.
        local ids i
        ids=$(squeue -h -o %i 2>/dev/null || true)
        if [[ -n $ids ]]; then
            # shellcheck disable=SC2086
            scancel $ids 2>/dev/null || true
            for ((i = 0; i < 60; i++)); do
                [[ -z $(squeue -h -t RUNNING,COMPLETING,PENDING -o %i 2>/dev/null || true) ]] && break
                sleep 0.25
            done
            info "cancelled jobs: ${ids//$'\n'/ }"
        fi
    fi
    stop_daemon "$RUN_DIR/slurmd.pid" slurmd
    stop_daemon "$RUN_DIR/slurmctld.pid" slurmctld
    stop_daemon "$MUNGE_DIR/munged.pid" munged
}

cmd_status() {
    local rc=0 d pidfile
    for d in munged slurmctld slurmd; do
        if [[ $d == munged ]]; then pidfile="$MUNGE_DIR/munged.pid"; else pidfile="$RUN_DIR/$d.pid"; fi
        if alive "$pidfile" "$d"; then
            echo "$d: running (pid $(<"$pidfile"))"
        else
            echo "$d: not running"
            rc=3
        fi
    done
    echo "state directory: $DIR"
    echo "export SLURM_CONF=$CONF"
    if ((rc == 0)); then
        echo
        SLURM_CONF="$CONF" sinfo || rc=3
        echo
        SLURM_CONF="$CONF" squeue || true
    fi
    return "$rc"
}

# Serialise start/stop: two test sessions starting the cluster at once must not
# race to launch two slurmctlds on one port.
lock() {
    mkdir -p "$DIR"
    exec 9>"$DIR/.lock"
    if command -v flock >/dev/null 2>&1; then
        flock -w 300 9 || die "another start/stop holds $DIR/.lock for over 300s"
    fi
}

case ${1:-} in
start) lock && cmd_start ;;
stop) lock && cmd_stop ;;
status) cmd_status ;;
restart) lock && cmd_stop && cmd_start ;;
*)
    echo "usage: $PROG start|stop|status|restart" >&2
    exit 2
    ;;
esac
