#!/bin/bash
# bcp-pipeline run demo-RUN, stage pretrain: 2 hosts of a parallel environment x 1 rank(s) = RANK 0..1 of WORLD_SIZE 2
#$ -N demo-RUN.pretrain
#$ -S /bin/bash
#$ -wd <ROOT>/.bcp-pipeline/workspaces/demo
#$ -j y
#$ -o <ROOT>/runs/demo-RUN/logs/sge-$JOB_ID.log
#$ -l h_rt=1:00:00
#$ -pe pe_node 2
#$ -P tga-lab
#$ -l node_f=1
logs=<ROOT>/runs/demo-RUN/logs nodes=2 per_node=1 world=2
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
run_rank() { exec apptainer exec --nv --bind <ROOT>/.bcp-pipeline/workspaces/demo:/mount_workspace,<ROOT>/stages:<ROOT>/stages,<ROOT>/runs/demo-RUN:<ROOT>/runs/demo-RUN,/data:/data:ro '/images/nemo framework 24.05.sif' bash <ROOT>/stages/bootstrap.sh python3 <ROOT>/stages/pretrain_local.py --data-dir /mount_workspace/data/slimpajama/preprocessed --results /mount_workspace/results --run-name demo-gpt-demo-RUN --steps 60 --checkpoint-every 20 --global-batch-size 8 --valid-data-dir /mount_workspace/data/slimpajama/validation/preprocessed; }
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
if [ "${1:-}" = --node ]; then  # one host's part, started below by `qrsh -inherit`
  export MASTER_ADDR="$3" MASTER_PORT="$4"
  launch_node "$2"
  exit $?
fi
mapfile -t hosts < <(awk '{print $1}' "$PE_HOSTFILE")
if [ "${#hosts[@]}" -ne "$nodes" ]; then
  echo "bcp-pipeline: \$PE_HOSTFILE lists ${#hosts[@]} host(s), the stage needs $nodes (one per node: a parallel environment with allocation_rule 1, or the site's whole-node request)" >&2
  exit 1
fi
master_addr="${hosts[0]}" master_port="$((20000 + (JOB_ID * 7 + ${SGE_TASK_ID/undefined/0}) % 20000))"
mkdir -p "$logs/$JOB_ID" && cp "$0" "$logs/$JOB_ID/job.sh"
qrsh=qrsh
if [ -n "${SGE_ROOT:-}" ]; then
  arch=$("$SGE_ROOT/util/arch" 2>/dev/null || true)
  if [ -x "$SGE_ROOT/bin/$arch/qrsh" ]; then qrsh="$SGE_ROOT/bin/$arch/qrsh"; fi
fi
code=0 pids=()
for node in "${!hosts[@]}"; do
  "$qrsh" -inherit -nostdin "${hosts[node]}" /bin/bash "$logs/$JOB_ID/job.sh" --node "$node" "$master_addr" "$master_port" &
  pids+=($!)
done
for node in "${!pids[@]}"; do
  wait "${pids[node]}" || { echo "bcp-pipeline: node $node (${hosts[node]}) failed" >&2; code=1; }
done
exit "$code"
