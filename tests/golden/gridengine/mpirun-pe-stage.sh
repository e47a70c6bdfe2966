#!/bin/bash
# bcp-pipeline run demo-RUN, stage pretrain: 2 hosts of a parallel environment x 2 rank(s) = RANK 0..3 of WORLD_SIZE 4
#$ -N demo-RUN.pretrain
#$ -S /bin/bash
#$ -wd <ROOT>/.bcp-pipeline/workspaces/demo
#$ -j y
#$ -o <ROOT>/.bcp-pipeline/runs/demo-RUN/logs/sge-$JOB_ID.log
#$ -l h_rt=1:00:00
#$ -pe pe_node 2
logs=<ROOT>/.bcp-pipeline/runs/demo-RUN/logs nodes=2 per_node=2 world=4
# The job's own start and exit records (logs/ID/task-N.*), read before Grid Engine's accounting, which lags
# on a busy site (bcp_pipeline/backends/gridengine/records.py); not by a parallel job's `--node` parts.
bcp_record() { printf '%s\n' "$2" > "$record.$1.tmp$$" && sync "$record.$1.tmp$$" &&
  mv -f "$record.$1.tmp$$" "$record.$1" || echo "bcp-pipeline: cannot write $record.$1" >&2; }
if [ "${1:-}" != --node ]; then
  record="$logs/$JOB_ID/task-${SGE_TASK_ID/undefined/1}"
  mkdir -p "$logs/$JOB_ID" && bcp_record started "host=$(hostname) time=$(date +%s) tasks=1"
  trap 'bcp_record exit "$?"' EXIT
fi
export BCP_PIPELINE_RUN_ID=demo-RUN BCP_PIPELINE_STAGE=pretrain
export STAGE_NOTE=s3cr3t-value-never-on-a-command-line
run_rank() { exec <PYTHON> <ROOT>/stages/pretrain_local.py --data-dir <ROOT>/.bcp-pipeline/workspaces/demo/data/slimpajama/preprocessed --results <ROOT>/.bcp-pipeline/workspaces/demo/results --run-name demo-gpt-demo-RUN --steps 60 --checkpoint-every 20 --global-batch-size 8 --valid-data-dir <ROOT>/.bcp-pipeline/workspaces/demo/data/slimpajama/validation/preprocessed; }
launch_node() {
  local node=$1 local_rank rank code=0 pids=()
  mkdir -p "$logs/$JOB_ID"
  for ((local_rank = 0; local_rank < per_node; local_rank++)); do
    rank=$((node * per_node + local_rank))
    (export RANK=$rank LOCAL_RANK=$local_rank NODE_RANK=$node GROUP_RANK=$node WORLD_SIZE=$world \
       LOCAL_WORLD_SIZE=$per_node; run_rank) >> "$logs/$JOB_ID/rank-$(printf %05d "$rank").log" 2>&1 &
    pids+=($!)
  done
  for rank in "${!pids[@]}"; do
    wait "${pids[rank]}" || { echo "bcp-pipeline: rank $((node * per_node + rank)) on $(hostname) exited $?" >&2; code=1; }
  done
  return "$code"
}
if [ "${1:-}" = --node ]; then  # one host's part, started below by Open MPI's mpirun
  node="${OMPI_COMM_WORLD_RANK:-}" this_host=$(hostname)
  if [ -z "$node" ] || [ "${OMPI_COMM_WORLD_SIZE:-}" != "$nodes" ]; then
    echo "bcp-pipeline: $this_host: not started by mpirun over $nodes hosts (OMPI_COMM_WORLD_RANK=${OMPI_COMM_WORLD_RANK:-unset}, OMPI_COMM_WORLD_SIZE=${OMPI_COMM_WORLD_SIZE:-unset})" >&2
    exit 1
  fi
  if [ "$node" = 0 ] && [ "${5%%.*}" != "${this_host%%.*}" ]; then
    echo "bcp-pipeline: mpirun started node 0 on $this_host, not on the first host $5 (MASTER_ADDR's)" >&2
    exit 1
  fi
  unset OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_LOCAL_RANK OMPI_COMM_WORLD_LOCAL_SIZE \
    OMPI_COMM_WORLD_NODE_RANK
  # Open MPI made this part a process group of its own, which the cell's kill of the job can miss (`qdel` left the
  # first host's ranks running on the test cell): the group ends with its parent, mpirun or Open MPI's daemon
  # (only where it is this part's own group, never the batch script's: /proc/PID/stat's 5th field).
  parent=$PPID stat=($(< /proc/$$/stat))
  if [ "${stat[4]:-}" = "$$" ]; then
    ( while kill -0 "$parent" 2>/dev/null; do sleep 1; done; kill -KILL 0 ) </dev/null >/dev/null 2>&1 &
  fi
  export MASTER_ADDR="$3" MASTER_PORT="$4"
  launch_node "$node"
  exit $?
fi
mapfile -t hosts < <(awk '{print $1}' "$PE_HOSTFILE")
if [ "${#hosts[@]}" -ne "$nodes" ]; then
  echo "bcp-pipeline: \$PE_HOSTFILE lists ${#hosts[@]} host(s), the stage needs $nodes (one per node: a parallel environment with allocation_rule 1, or the site's whole-node request)" >&2
  exit 1
fi
master_addr="${hosts[0]}" master_port="$((20000 + (JOB_ID * 7 + ${SGE_TASK_ID/undefined/0}) % 20000))"
master_addr_command() {  # gridengine.master_addr_command: the first word it prints is MASTER_ADDR
printf '%s\n' 10.0.0.7 other
}
if ! said=$(master_addr_command) || ! read -r master_addr _ <<< "$said" || [ -z "$master_addr" ]; then
  echo "bcp-pipeline: gridengine.master_addr_command gave no address on $(hostname): ${said:-(nothing printed)}" >&2
  exit 1
fi
mkdir -p "$logs/$JOB_ID" && cp "$0" "$logs/$JOB_ID/job.sh"
qrsh=qrsh
if [ -n "${SGE_ROOT:-}" ]; then
  arch=$("$SGE_ROOT/util/arch" 2>/dev/null || true)
  if [ -x "$SGE_ROOT/bin/$arch/qrsh" ]; then qrsh="$SGE_ROOT/bin/$arch/qrsh"; fi
fi
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
