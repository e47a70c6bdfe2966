"""What `plan` says of a Kubernetes job beside its manifests (pure): what its pods run, in words, and where its ranks
meet."""

from __future__ import annotations

from bcp_pipeline.backends.contract import JobRequest
from bcp_pipeline.backends.kubernetes import nemo_pod
from bcp_pipeline.backends.kubernetes.render import elastic_policy, is_pytorchjob, job_name, shape
from bcp_pipeline.backends.shared.bridge_command import trains_with_bridge
from bcp_pipeline.backends.shared.command import rendezvous
from bcp_pipeline.config.resources import KubernetesOptions, RankLayout


def what_it_runs(request: JobRequest, options: KubernetesOptions) -> str:
    """What the job's pods run, in words (`plan` prints it above the manifests): a training engine by name, never
    the stage's `program` where the engine runs instead."""
    size = shape(request, options)
    pods = f"{size.pods} pod(s)"
    if nemo_pod.trains_with_nemo(request):
        return (
            f"NVIDIA's NeMo launcher: its debug mode composes the training config on the first pod, then "
            f"torchrun in each of {pods} runs NeMo's megatron_gpt_pretraining.py, a rank on each of "
            f"{size.processes} GPU(s) a pod"
        )
    if trains_with_bridge(request, "kubernetes"):
        return (
            f"Megatron-Bridge: the data list, then torchrun in each of {pods} runs stages/bridge_pretrain.py, a "
            f"rank on each of {size.processes} GPU(s) a pod"
        )
    what = "the stage's kubernetes.command" if request.resources("kubernetes").command else request.program
    if is_pytorchjob(request):
        return f"torchrun in each of {pods} runs {what}, {size.processes} process(es) a pod"
    return f"{what} in each of {pods}, {size.processes} process(es) a pod"


def job_rendezvous(request: JobRequest, options: KubernetesOptions) -> dict | None:
    size = shape(request, options)
    layout = RankLayout(nodes=size.pods, per_node=size.processes)
    name = job_name(request)
    if is_pytorchjob(request) and (elastic := request.resources("kubernetes").elastic_policy) is not None:
        bounds = elastic_policy(elastic, size.pods)
        return rendezvous(
            layout,
            f"{name}-worker-0 (the first Worker pod: {elastic.rdzv_backend} elastic "
            f"rendezvous of {bounds['minReplicas']} to {bounds['maxReplicas']} pods; ranks are given "
            "out there)",
            str(options.master_port),
        )
    if is_pytorchjob(request):
        # The training operator's: its Master pod's Service, named after the job's Master replica.
        return rendezvous(
            layout,
            f"{name}-master-0 (the Master pod, through the training operator's Service)",
            str(options.master_port),
        )
    return rendezvous(
        layout, f"{name}-0.{name} (the index-0 pod, through the headless Service)", str(options.master_port)
    )
