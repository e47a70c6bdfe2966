# shellcheck shell=bash
# Rendered by records.py script, after `logs=` is set; @TASKS@ is the job's number of array tasks.
# `${1:-}`: a parallel job's hosts rerun the script as `--node`; only the batch script's own run (the job's exit
# status in accounting) records. `sync FILE` fsyncs it before the rename.
# shellcheck disable=SC2154  # logs: set by the job script's first lines

# The job's own start and exit records (logs/ID/task-N.*), read before Grid Engine's accounting, which lags
# on a busy site (bcp_pipeline/backends/gridengine/records.py); not by a parallel job's `--node` parts.
bcp_record() { printf '%s\n' "$2" > "$record.$1.tmp$$" && sync "$record.$1.tmp$$" &&
  mv -f "$record.$1.tmp$$" "$record.$1" || echo "bcp-pipeline: cannot write $record.$1" >&2; }
if [ "${1:-}" != --node ]; then
  record="$logs/$JOB_ID/task-${SGE_TASK_ID/undefined/1}"
  mkdir -p "$logs/$JOB_ID" && bcp_record started "host=$(hostname) time=$(date +%s) tasks=@TASKS@"
  trap 'bcp_record exit "$?"' EXIT
fi
