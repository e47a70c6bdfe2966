# shellcheck shell=bash
# One node's ranks (render.py node_launcher): started together, each with its own log, all waited for (every rank
# runs to its end even if another fails, so a rerun has the least left to redo); the node's result is 1 if any rank
# failed. run_rank is the job script's function that runs one rank.
# shellcheck disable=SC2154  # logs, per_node, world: set by the job script's first lines

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
