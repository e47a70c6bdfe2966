# shellcheck shell=bash
# A job over several hosts, in its batch script (training.py fan_out_to_hosts): the hosts of $PE_HOSTFILE, one per
# node, the rendezvous at the first; this script is copied next to the logs and started again on each host
# (start_by_qrsh.sh or start_by_mpirun.sh follow). Tokens: @PORT_EXPRESSION@ (shell arithmetic, MASTER_PORT),
# @MASTER_ADDR_COMMAND@ (master_addr_command.sh, or nothing), @FIND_QRSH@ (training.py FIND_QRSH: sets $qrsh).
# shellcheck disable=SC2154  # logs, nodes: set by the job script's first lines
# shellcheck disable=SC2034  # master_addr, master_port: read by the start_by_*.sh part that follows

mapfile -t hosts < <(awk '{print $1}' "$PE_HOSTFILE")
if [ "${#hosts[@]}" -ne "$nodes" ]; then
  echo "bcp-pipeline: \$PE_HOSTFILE lists ${#hosts[@]} host(s), the stage needs $nodes (one per node: a parallel environment with allocation_rule 1, or the site's whole-node request)" >&2
  exit 1
fi
master_addr="${hosts[0]}" master_port="$((@PORT_EXPRESSION@))"
@MASTER_ADDR_COMMAND@
mkdir -p "$logs/$JOB_ID" && cp "$0" "$logs/$JOB_ID/job.sh"
@FIND_QRSH@
