#!/usr/bin/env bash
# Stop the cluster that slurm-up.sh started, by the PIDs in its pid files (slurmd, slurmctld,
# slurmdbd, mariadbd, munged), then any job step it left behind: processes whose working directory
# is under $S2O_SLURM_BASE (slurmstepd runs in the spool folder), with their descendants. Safe to
# run when nothing is running; leaves the folder (logs) in place.
set -uo pipefail
base=${S2O_SLURM_BASE:-/tmp/s2o-slurm}

alive() {  # a PID counts as alive if it exists and is not a zombie (PID 1 here reaps late)
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  [ "$(echo "${stat##*) }" | cut -d' ' -f1)" != Z ]
}

stop() {  # stop PID: TERM, up to 10 s, then KILL
  local pid=$1
  alive "$pid" || return 0
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 50); do alive "$pid" || return 0; sleep 0.2; done
  kill -KILL "$pid" 2>/dev/null
}

for daemon in slurmd slurmctld slurmdbd mariadbd munged; do
  pidfile=$base/run/$daemon.pid
  [ -s "$pidfile" ] || continue
  pid=$(tr -dc 0-9 < "$pidfile")
  # the pid file may be stale and its PID reused: only stop the daemon it names (Debian's
  # slurmctld and slurmd binaries are slurmctld-wlm and slurmd-wlm)
  exe=$(basename "$(readlink "/proc/$pid/exe" 2>/dev/null)")
  if [ -n "$pid" ] && alive "$pid" && { [ "$exe" = "$daemon" ] || [ "$exe" = "$daemon-wlm" ]; }; then
    echo "slurm-down: stopping $daemon ($pid)"
    stop "$pid"
  fi
  rm -f "$pidfile"
done

# Job steps left running (their daemons were stopped mid-job): working directory under the base.
pids=()
for proc in /proc/[0-9]*; do
  cwd=$(readlink "$proc/cwd" 2>/dev/null) || continue
  case $cwd in "$base"|"$base"/*) pids+=("${proc#/proc/}") ;; esac
done
if [ ${#pids[@]} -gt 0 ]; then
  # add their descendants (ppid is field 4 of /proc/PID/stat, after the command in parentheses)
  mapfile -t pids < <(for stat in /proc/[0-9]*/stat; do s=$(cat "$stat" 2>/dev/null) || continue
                        set -- ${s##*) }; echo "${stat//[^0-9]/} $2"; done |
                      awk -v roots="${pids[*]}" 'BEGIN { n = split(roots, r, " "); for (i = 1; i <= n; i++) keep[r[i]] = 1 }
                           { parent[$1] = $2 }
                           END { do { grew = 0; for (p in parent) if (!(p in keep) && (parent[p] in keep)) { keep[p] = 1; grew = 1 } } while (grew);
                                 for (p in keep) print p }')
  echo "slurm-down: stopping leftover job processes ${pids[*]}"
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null; done
fi
exit 0
