# shellcheck shell=bash
# A host's part started by start_by_mpirun.sh (training.py host_part): its node rank is its Open MPI rank, checked
# (node 0 must run on the first host, where MASTER_ADDR is); the OMPI_COMM_WORLD_* variables are then dropped: they
# describe the host launchers, and a rank's library (Lightning, mpi4py) must not take them for its own rank.
# shellcheck disable=SC2154  # nodes: set by the job script's first lines

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
# shellcheck disable=SC2207  # split on purpose: /proc/PID/stat is space-separated, and bash's name has no space
parent=$PPID stat=($(< /proc/$$/stat))
if [ "${stat[4]:-}" = "$$" ]; then
  ( while kill -0 "$parent" 2>/dev/null; do sleep 1; done; kill -KILL 0 ) </dev/null >/dev/null 2>&1 &
fi
