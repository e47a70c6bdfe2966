# shellcheck shell=bash
# Each task of the `check` probe job (check.py probe_script: `srun bash -c` of these lines joined by spaces): it
# prints its rank variables; task 0 also the Python facts (@PYTHON@ -c @PROBE@ @MODULES@) and writes @MARKER@ to
# @MARKER_FILE@ in the workspace folder @WORKSPACE@. probe_script shell-quotes the interpreter, the program and the paths; the module names and
# the marker are plain words.

echo "BCPP-PROBE procid=$SLURM_PROCID ntasks=$SLURM_NTASKS localid=$SLURM_LOCALID host=$(hostname) shell=$0";
if [ "$SLURM_PROCID" = 0 ]; then
echo "BCPP-PYTHON $(@PYTHON@ -c @PROBE@ @MODULES@ 2>&1)";
mkdir -p @WORKSPACE@ && echo @MARKER@ > @MARKER_FILE@; fi
