#!/bin/bash
# bcp-pipeline run RUN, stage pretrain: NeMo pretraining the TSUBAME way, 2 host(s) x 4 GPU(s) = WORLD_SIZE 8: torchrun on every host, in the Apptainer image (bcp_pipeline/backends/gridengine/training.py).
#$ -N RUN.pretrain
#$ -S /bin/bash
#$ -wd <ROOT>/.bcp-pipeline/workspaces/nemo-framework
#$ -j y
#$ -o <ROOT>/.bcp-pipeline/runs/RUN/logs/sge-$JOB_ID.log
#$ -l h_rt=4:00:00
#$ -pe pe_node 2
#$ -l node_f=1
set -euo pipefail
logs=<ROOT>/.bcp-pipeline/runs/RUN/logs nodes=2 per_node=4
# The job's own start and exit records (logs/ID/task-N.*), read before Grid Engine's accounting, which lags
# on a busy site (bcp_pipeline/backends/gridengine/records.py); not by a parallel job's `--node` parts.
bcp_record() { printf '%s\n' "$2" > "$record.$1.tmp$$" && sync "$record.$1.tmp$$" &&
  mv -f "$record.$1.tmp$$" "$record.$1" || echo "bcp-pipeline: cannot write $record.$1" >&2; }
if [ "${1:-}" != --node ]; then
  record="$logs/$JOB_ID/task-${SGE_TASK_ID/undefined/1}"
  mkdir -p "$logs/$JOB_ID" && bcp_record started "host=$(hostname) time=$(date +%s) tasks=1"
  trap 'bcp_record exit "$?"' EXIT
fi
export BCP_PIPELINE_RUN_ID=RUN BCP_PIPELINE_STAGE=pretrain
export NCCL_DEBUG=WARN
in_image() { apptainer exec --nv --bind <ROOT>/.bcp-pipeline/workspaces/nemo-framework:/mount_workspace,<ROOT>/stages:<ROOT>/stages,<ROOT>/.bcp-pipeline/runs/RUN:<ROOT>/.bcp-pipeline/runs/RUN '/images/nemo 24.05.sif' "$@"; }
train_host() {  # MASTER_ADDR MASTER_PORT: this host's torchrun, its ranks' logs their own
  mkdir -p "$logs/$JOB_ID"
  in_image torchrun --nnodes "$nodes" --nproc_per_node "$per_node" --rdzv-backend c10d --rdzv-endpoint "$1:$2" \
    --rdzv-id "$JOB_ID" --no-python bash -c 'log="$0/rank-$(printf %05d "$RANK").log"; "$@" >> "$log" 2>&1 || { code=$?; echo "bcp-pipeline: rank $RANK on $HOSTNAME exited $code" >&2; exit "$code"; }' \
    "$logs/$JOB_ID" python3 -u /opt/NeMo/examples/nlp/language_modeling/megatron_gpt_pretraining.py --config-path=/mount_workspace/results/gpt_126m-RUN --config-name=gpt_126m-RUN_hydra.yaml
}
if [ "${1:-}" = --node ]; then  # one host's part, started below by `qrsh -inherit`
  train_host "$3" "$4"
  exit $?
fi
mkdir -p "$logs/$JOB_ID"

# The data list: every .bin/.idx pair of the preprocess manifests, weighted by tokens.
mkdir -p <ROOT>/.bcp-pipeline/runs/RUN/results/pretrain
in_image python3 <ROOT>/stages/data_list.py --data-dir /mount_workspace/data/slimpajama/preprocessed --valid-data-dir /mount_workspace/data/slimpajama/validation/preprocessed --test-data-dir /mount_workspace/data/slimpajama/test/preprocessed --split-form nemo --format hydra --key training.model.data.data_prefix --out <ROOT>/.bcp-pipeline/runs/RUN/results/pretrain/data_prefix.txt

# The training config as NVIDIA's launcher composes it for the stage (debug mode: written, nothing run).
mapfile -t data_list < <ROOT>/.bcp-pipeline/runs/RUN/results/pretrain/data_prefix.txt
overrides=(
  cluster_type=bcp
  'stages=[training]'
  training=gpt3/126m
  launcher_scripts_path=/opt/NeMo-Megatron-Launcher/launcher_scripts
  data_dir=/mount_workspace/data
  base_results_dir=/mount_workspace/results
  training.run.name=gpt_126m-RUN
  training.trainer.num_nodes=2
  training.trainer.devices=4
  training.trainer.max_steps=600000
  +training.exp_manager.max_time_per_run=0:03:15:00
  training.model.tokenizer.vocab_file=/mount_workspace/data/bpe/vocab.json
  training.model.tokenizer.merge_file=/mount_workspace/data/bpe/merges.txt
  "${data_list[@]}"
)
in_image rm -f /mount_workspace/results/gpt_126m-RUN/gpt_126m-RUN_hydra.yaml
NEMO_LAUNCHER_DEBUG=1 in_image python3 /opt/NeMo-Megatron-Launcher/launcher_scripts/main.py "${overrides[@]}"
in_image test -s /mount_workspace/results/gpt_126m-RUN/gpt_126m-RUN_hydra.yaml || { echo 'bcp-pipeline: the NeMo launcher wrote no /mount_workspace/results/gpt_126m-RUN/gpt_126m-RUN_hydra.yaml' >&2; exit 1; }

# The training: one torchrun a host; the job's status is the worst host's.
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
