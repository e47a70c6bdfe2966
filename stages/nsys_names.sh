# Sourced by every bash of a BCP profile job (BASH_ENV, set by `bcp-pipeline profile`; config/profiling.py).
# NeMo's launcher names each Nsight Systems file profile_${SLURM_JOB_ID}_node${SLURM_NODEID}_rank${SLURM_PROCID},
# expanded in each rank's own shell. Where bcprun does not set these, every rank would write the same file: each
# takes BCP's values instead (the job id, the replica index, the rank bcprun gives the process), and keeps any
# value already set. Lightning takes a job for Slurm only with SLURM_NTASKS, which this never sets.
: "${SLURM_JOB_ID:=${NGC_JOB_ID:-job}}"
: "${SLURM_NODEID:=${NGC_ARRAY_INDEX:-0}}"
: "${SLURM_PROCID:=${RANK:-${OMPI_COMM_WORLD_RANK:-${PMIX_RANK:-0}}}}"
export SLURM_JOB_ID SLURM_NODEID SLURM_PROCID
