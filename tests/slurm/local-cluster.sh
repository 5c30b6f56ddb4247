#!/usr/bin/env bash
# A real Slurm on one machine, two nodes (n1, n2), for `make test-slurm`:
#   bash tests/slurm/local-cluster.sh start   # prints `export SLURM_CONF=...`; the commands need it
#   bash tests/slurm/local-cluster.sh stop    # stops, by pid, exactly the daemons `start` started
# Needs root and Debian's slurmctld, slurmd, slurm-client and munge (Slurm 22.05 on bookworm), which it installs when
# they are missing. Everything it writes lives in $SLURM_LOCAL_DIR (default /tmp/vocagnolm-slurm): the config, a munge
# socket of its own (a system munged, if any, is left alone), state, pid files and logs. Starting twice is a no-op.
#
# What makes the stock packages work here: no cgroups (linuxproc, task/none), no accounting, every address 127.0.0.1
# (no name resolution), two NodeNames on one host with their own Port and spool directory (`slurmd -N NAME`),
# credentials that expire after 5 s and a scheduler pass every second, so that a requeued job runs again within
# seconds instead of ~150 s.
set -euo pipefail
DIR=${SLURM_LOCAL_DIR:-/tmp/vocagnolm-slurm}
CONF=$DIR/slurm.conf
NODES=(n1 n2)
PACKAGES=(slurmctld slurmd slurm-client munge)

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

install() {
    local missing=()
    for exe in slurmctld slurmd sbatch munged; do command -v "$exe" >/dev/null || missing+=("$exe"); done
    [ ${#missing[@]} -eq 0 ] && return
    if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
        echo "local-cluster: missing ${missing[*]}: as root on Debian run apt-get install ${PACKAGES[*]}" >&2
        exit 1
    fi
    echo "local-cluster: installing ${PACKAGES[*]}" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${PACKAGES[@]}" >/dev/null
}

write_config() {
    # The node's layout as slurmd sees it (CPUs, Boards, Sockets..., RealMemory), less its NodeName and UpTime.
    local layout
    layout=$(slurmd -C | head -n1 | tr ' ' '\n' | grep -v -e '^NodeName=' -e '^UpTime=' | tr '\n' ' ')
    cat >"$CONF" <<EOF
ClusterName=local
SlurmctldHost=$(hostname)(127.0.0.1)
SlurmctldPort=6917
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket,cred_expire=5
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerParameters=sched_interval=1
ReturnToService=2
MailProg=/bin/true
NodeName=n1 NodeHostname=$(hostname) NodeAddr=127.0.0.1 Port=6918 $layout
NodeName=n2 NodeHostname=$(hostname) NodeAddr=127.0.0.1 Port=6919 $layout
PartitionName=local Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP
EOF
}

start() {
    install
    if [ "$(id -u)" -ne 0 ]; then  # munged runs as munge, slurmd as root
        echo "local-cluster: needs root to start munged and slurmd" >&2
        exit 1
    fi
    mkdir -p "$DIR/state" "$DIR/munge" "${NODES[@]/#/$DIR/}"
    write_config
    chown munge: "$DIR/munge" && chmod 755 "$DIR/munge"
    [ -f /etc/munge/munge.key ] || runuser -u munge -- mungekey --create  # the package makes one; in case it did not
    alive "$DIR/munge/munged.pid" || runuser -u munge -- munged --socket="$DIR/munge/munge.socket" \
        --pid-file="$DIR/munge/munged.pid" --log-file="$DIR/munge/munged.log" --seed-file="$DIR/munge/munged.seed"
    # -c: forget jobs of an earlier run of this cluster
    alive "$DIR/slurmctld.pid" || slurmctld -c -f "$CONF"
    for node in "${NODES[@]}"; do
        alive "$DIR/slurmd-$node.pid" || slurmd -f "$CONF" -N "$node"
    done
    export SLURM_CONF=$CONF
    for _ in $(seq 60); do  # both nodes idle: ready for jobs
        [ "$(sinfo -h -N -o '%t' 2>/dev/null | grep -c '^idle')" -eq ${#NODES[@]} ] && break
        sleep 1
    done
    if [ "$(sinfo -h -N -o '%t' | grep -c '^idle')" -ne ${#NODES[@]} ]; then
        echo "local-cluster: the nodes did not come up; see $DIR/*.log" >&2
        sinfo -N >&2
        exit 1
    fi
    echo "export SLURM_CONF=$CONF"
}

stop() {
    # slurmds first, so that no node asks a stopped controller; each daemon by the pid file that its start wrote
    for pid_file in "${NODES[@]/#/$DIR/slurmd-}" "$DIR/slurmctld" "$DIR/munge/munged"; do
        alive "$pid_file.pid" || continue
        pid=$(cat "$pid_file.pid")
        kill "$pid"
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    done
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
