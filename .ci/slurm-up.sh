#!/usr/bin/env bash
# Start a single-node SLURM cluster on this machine for the `slurm` tests: munged, MariaDB, slurmdbd
# (accounting: without it submitit never learns that a killed job ended), slurmctld and slurmd, from
# Debian's packages (slurm-wlm munge slurmdbd mariadb-server), started by hand (no systemd), run as
# root. Everything lives under one fixed folder, $S2O_SLURM_BASE (default /tmp/s2o-slurm): configs,
# state, logs, pid files. Idempotent: whatever a previous start left is stopped first (slurm-down.sh).
# Progress goes to stderr; the last line on stdout is `export SLURM_CONF=<path>`, so:
#   eval "$(.ci/slurm-up.sh | tail -n 1)"      ...      .ci/slurm-down.sh
# What was checked on a machine like the CI one, with its pitfalls: ../shared/reference/slurm-ci.md.
set -euo pipefail
base=${S2O_SLURM_BASE:-/tmp/s2o-slurm}
here=$(cd "$(dirname "$0")" && pwd)
say() { echo "slurm-up: $*" >&2; }
die() { say "$*"; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (daemons run as root here)"
for cmd in munged mungekey mariadbd mariadb-install-db mariadb slurmdbd slurmctld slurmd sinfo sacctmgr; do
  command -v "$cmd" >/dev/null || die "$cmd not found: apt-get install slurm-wlm munge slurmdbd mariadb-server"
done
S2O_SLURM_BASE=$base "$here/slurm-down.sh" >&2
for port in 3307 6817 6818 6819; do  # a daemon that is not ours holds the port: do not fight it
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then die "port $port is in use"; fi
done

rm -rf "$base"
mkdir -p "$base"/{munge,db,state,spool,log,run}
chmod 755 "$base" "$base/munge"  # munged wants its socket folder reachable by all
host=$(hostname -s)
cpus=$(nproc)
mem_mb=$(( $(awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo) - 1024 ))
sock=$base/munge/munge.socket.2
conf=$base/slurm.conf
cat > "$conf" <<EOF
ClusterName=ci
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$sock
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
MinJobAge=3600
KillWait=5
StateSaveLocation=$base/state
SlurmdSpoolDir=$base/spool
SlurmctldPidFile=$base/run/slurmctld.pid
SlurmdPidFile=$base/run/slurmd.pid
SlurmctldLogFile=$base/log/slurmctld.log
SlurmdLogFile=$base/log/slurmd.log
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=6819
AccountingStoragePass=$sock
JobAcctGatherType=jobacct_gather/linux
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
cat > "$base/slurmdbd.conf" <<EOF
AuthType=auth/munge
AuthInfo=socket=$sock
DbdHost=localhost
DbdPort=6819
SlurmUser=root
PidFile=$base/run/slurmdbd.pid
LogFile=$base/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=3307
StorageUser=slurm
StoragePass=ci
StorageLoc=slurm_acct
EOF
chmod 600 "$base/slurmdbd.conf"

wait_for() {  # wait_for SECONDS WHAT COMMAND...: poll until COMMAND succeeds
  local limit=$1 what=$2; shift 2
  for _ in $(seq $((limit * 5))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  die "$what did not come up in ${limit}s; logs in $base/log"
}

say "munged"
mungekey --create --keyfile="$base/munge/munge.key"
chmod 400 "$base/munge/munge.key"
# Never --force: it takes the socket of a running munged and orphans that daemon.
munged --key-file="$base/munge/munge.key" --socket="$sock" --pid-file="$base/run/munged.pid" \
  --log-file="$base/log/munged.log" --seed-file="$base/munge/munge.seed"

say "mariadb"
mariadb-install-db --user=root --datadir="$base/db" --skip-test-db > "$base/log/mariadb-install.log" 2>&1
# setsid: mariadbd stays in the foreground; its own session keeps it out of the caller's process
# group (a CI runner killing that group must not take the database down under slurmdbd).
setsid mariadbd --no-defaults --user=root --datadir="$base/db" --socket="$base/run/mysqld.sock" \
  --pid-file="$base/run/mariadbd.pid" --bind-address=127.0.0.1 --port=3307 \
  --log-error="$base/log/mariadbd.log" </dev/null >/dev/null 2>&1 &
wait_for 30 mariadb mariadb --socket="$base/run/mysqld.sock" -uroot -e 'SELECT 1'
mariadb --socket="$base/run/mysqld.sock" -uroot -e "
  CREATE DATABASE slurm_acct;
  CREATE USER 'slurm'@'localhost' IDENTIFIED BY 'ci';
  CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY 'ci';
  GRANT ALL ON slurm_acct.* TO 'slurm'@'localhost';
  GRANT ALL ON slurm_acct.* TO 'slurm'@'127.0.0.1';"

export SLURM_CONF=$conf
say "slurmdbd"
slurmdbd
wait_for 30 slurmdbd timeout 5 sacctmgr -n show cluster
say "slurmctld, slurmd"
slurmctld -i -f "$conf"
slurmd -f "$conf"
idle() { sinfo -h -o %t | grep -qx idle; }
wait_for 30 "the node (sinfo: idle)" idle
say "up: $(sinfo -h -o '%P %D %t %c CPUs')"
echo "export SLURM_CONF=$conf"
