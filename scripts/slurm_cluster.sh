#!/usr/bin/env bash
# A one-node SLURM cluster on localhost, for the `slurm` tests and for trying `--executor slurm`.
#
#   scripts/slurm_cluster.sh start DIR    # install slurm-wlm + munge with apt if missing (root),
#                                         # write DIR/slurm.conf, start munged, slurmctld, slurmd
#   export SLURM_CONF=DIR/slurm.conf      # then sbatch / squeue / cgpt sweep --executor slurm
#   scripts/slurm_cluster.sh stop DIR     # stop the three daemons started in DIR
#
# Everything lives in DIR (config, state, logs, munge key and socket, pid files), so it never
# touches a system SLURM or munge. Daemons run as root (SlurmUser=root), as CI does.
set -euo pipefail

cmd=${1:-}
dir=${2:-}
if [[ -z "$cmd" || -z "$dir" ]]; then
  echo "usage: $0 start|stop DIR" >&2
  exit 2
fi

stop() {
  local name pid
  for name in slurmd slurmctld munged; do
    if [[ -f "$dir/$name.pid" ]]; then
      pid=$(cat "$dir/$name.pid" 2>/dev/null || true)
      if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
      fi
      rm -f "$dir/$name.pid"
    fi
  done
}

if [[ "$cmd" == stop ]]; then
  stop
  exit 0
fi
if [[ "$cmd" != start ]]; then
  echo "$0: unknown command '$cmd'; use start or stop" >&2
  exit 2
fi

# ---- install ---------------------------------------------------------------------------------
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
  if [[ $(id -u) -ne 0 ]]; then
    echo "$0: slurm-wlm and munge are not installed and this is not root; run" \
         "'sudo apt-get install -y slurm-wlm munge' first" >&2
    exit 1
  fi
  echo "installing slurm-wlm and munge with apt-get ..." >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq </dev/null >&2
  apt-get install -y -qq --no-install-recommends slurm-wlm munge </dev/null >&2
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "$0: the daemons run as root here (SlurmUser=root); run as root" >&2
  exit 1
fi

# ---- configure -------------------------------------------------------------------------------
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
chmod 700 "$dir"
mkdir -p "$dir/state" "$dir/spool" "$dir/log"
stop  # a previous cluster in the same DIR

if [[ ! -f "$dir/munge.key" ]]; then
  head -c 1024 /dev/urandom > "$dir/munge.key"
  chmod 400 "$dir/munge.key"
fi
cpus=$(nproc)
mem_mb=$(awk '/MemTotal/ {print int($2 / 1024 * 0.8)}' /proc/meminfo)
cat > "$dir/slurm.conf" <<EOF
ClusterName=cgpt-test
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge.socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldPort=${CGPT_SLURMCTLD_PORT:-16817}
SlurmdPort=${CGPT_SLURMD_PORT:-16818}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MpiDefault=none
KillWait=20
InactiveLimit=0
MinJobAge=300
SchedulerParameters=defer_batch
NodeName=localhost CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
export SLURM_CONF="$dir/slurm.conf"

# ---- start -----------------------------------------------------------------------------------
munged --force --socket="$dir/munge.socket" --key-file="$dir/munge.key" \
  --pid-file="$dir/munged.pid" --log-file="$dir/log/munged.log" --seed-file="$dir/munged.seed"
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF"

for _ in $(seq 120); do
  state=$(sinfo -h -N -o '%T' 2>/dev/null | head -1 || true)
  if [[ "$state" == idle* ]]; then
    echo "export SLURM_CONF=$SLURM_CONF"
    exit 0
  fi
  sleep 0.5
done
echo "$0: the node did not become idle within 60 s (state: '${state:-none}'); logs in $dir/log" >&2
tail -n 20 "$dir/log/"*.log >&2 || true
stop
exit 1
