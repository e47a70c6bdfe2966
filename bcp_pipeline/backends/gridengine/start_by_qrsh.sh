# shellcheck shell=bash
# After hosts.sh: one `qrsh -inherit` a host (tight integration: each host's part is a task of the job, accounted
# and killed with it); the job fails where any host's part does.
# shellcheck disable=SC2154  # hosts, qrsh, logs, master_addr, master_port: set by hosts.sh and the job script

code=0 pids=()
for node in "${!hosts[@]}"; do
  "$qrsh" -inherit -nostdin "${hosts[node]}" /bin/bash "$logs/$JOB_ID/job.sh" --node "$node" "$master_addr" "$master_port" &
  pids+=($!)
done
for node in "${!pids[@]}"; do
  wait "${pids[node]}" || { echo "bcp-pipeline: node $node (${hosts[node]}) failed" >&2; code=1; }
done
exit "$code"
