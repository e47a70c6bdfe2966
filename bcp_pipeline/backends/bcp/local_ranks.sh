# shellcheck shell=bash
# A BCP job's ranks on its one node, started by the job's shell (render.py local_ranks: `bash -c` of these lines
# joined by spaces; no bcprun needed). Each of @PROCESSES@ ranks runs @PROGRAM@ with RANK/WORLD_SIZE/LOCAL_RANK/
# LOCAL_WORLD_SIZE as bcprun would give them, and MASTER_ADDR/MASTER_PORT on loopback (all ranks share the node;
# without them a distributed program has no rendezvous). @LAST_RANK@ is @PROCESSES@ - 1, @PORT_EXPRESSION@ shell
# arithmetic. The job exits with the first failing rank's status, after every rank has ended (stage programs are
# idempotent: a rerun redoes only what is missing).

export MASTER_ADDR=127.0.0.1 MASTER_PORT=$((@PORT_EXPRESSION@));
pids=();
for rank in $(seq 0 @LAST_RANK@); do
RANK=$rank WORLD_SIZE=@PROCESSES@ LOCAL_RANK=$rank LOCAL_WORLD_SIZE=@PROCESSES@ @PROGRAM@ & pids+=($!); done;
status=0;
for pid in "${pids[@]}"; do wait "$pid" || { code=$?; [ "$status" = 0 ] && status=$code; }; done;
exit "$status"
