# shellcheck shell=bash
# The `check` probe's pods (probe.py PROBE_SCRIPT, run as `bash -c`): $1 the marker's path on the workspace mount,
# $2 the marker. Index 0 writes it, the others wait for it; each prints its rank, node and the marker it reads, then
# waits to be killed (how fast a deleted Job's pods end is one of the probe's rows). The body starts and ends with
# an empty line, as the probe always ran it.


RANK=$((JOB_COMPLETION_INDEX * ${BCP_PIPELINE_PROCESSES:-1}))
if [ "$JOB_COMPLETION_INDEX" = 0 ]; then echo "$2" > "$1.tmp" && mv "$1.tmp" "$1"; fi
# shellcheck disable=SC2034  # i: the loop only counts its 150 tries
for i in $(seq 1 150); do [ -f "$1" ] && break; sleep 0.2; done
echo "BCPP-POD index=$JOB_COMPLETION_INDEX rank=$RANK node=$BCPP_NODE host=$(hostname) marker=$(cat "$1" 2>/dev/null)"
trap 'echo BCPP-TERM; exit 0' TERM
echo BCPP-WAITING
sleep 600 & wait

