# shellcheck shell=bash
# After hosts.sh: Open MPI starts one process a host (`-npernode 1`) over a hostfile of the hosts in $PE_HOSTFILE's
# order, so its rank K runs on hosts[K]: node K (from_mpirun.sh reads it). Where it sees Grid Engine (SGE_ROOT, ARC,
# PE_HOSTFILE and JOB_ID set, $SGE_ROOT/bin/$ARC/qrsh there) Open MPI starts its daemons on the other hosts by
# `qrsh -inherit` itself, so they are the job's tasks and `qdel` ends them; without, it would use ssh, outside Grid
# Engine: said on the job log. (Open MPI gives each process its own process group, which Grid Engine's kill of the
# first host's part missed on the test cell: from_mpirun.sh ends it with its parent.) `--bind-to none`: Open MPI
# binds a process to one core by default, and each starts all of its host's ranks.
# shellcheck disable=SC2154  # hosts, logs, nodes, master_addr, master_port: set by hosts.sh and the job script

if [ -z "${ARC:-}" ] && [ -n "${arch:-}" ]; then export ARC="$arch"; fi
if [ -z "${SGE_ROOT:-}" ] || [ ! -x "$SGE_ROOT/bin/${ARC:-}/qrsh" ]; then
  echo "bcp-pipeline: warning: no \$SGE_ROOT/bin/\$ARC/qrsh here: Open MPI may start the other hosts with ssh, outside Grid Engine (qdel would not end them)" >&2
fi
printf '%s slots=1\n' "${hosts[@]}" > "$logs/$JOB_ID/hostfile"
code=0
mpirun -np "$nodes" -npernode 1 -hostfile "$logs/$JOB_ID/hostfile" --bind-to none \
  /bin/bash "$logs/$JOB_ID/job.sh" --node mpirun "$master_addr" "$master_port" "${hosts[0]}" || code=$?
if [ "$code" -ne 0 ]; then echo "bcp-pipeline: mpirun over ${hosts[*]} exited $code" >&2; fi
exit "$code"
