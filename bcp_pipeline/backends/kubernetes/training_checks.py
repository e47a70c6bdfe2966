"""What a Megatron-Bridge training's pods need that their manifests cannot show (pure): stages/ where the pods look
for it, and EFA on the EFA instance types a node selector names. docs/backends/kubernetes.md, "Pretraining"."""

from __future__ import annotations

import re
from dataclasses import fields

from bcp_pipeline.backends.contract import JobRequest
from bcp_pipeline.backends.shared.bridge_command import trains_with_bridge
from bcp_pipeline.config.resources import KubernetesOptions, KubernetesResources

# NVIDIA's own NGC images (nvcr.io/nvidia/nemo:26.08, .../pytorch:...): they never hold this project's stages/.
STOCK_NGC_IMAGE = re.compile(r"^nvcr\.io/nvidia/[^/]+([:@]|$)")
IN_IMAGE_CODE_DIR = next(f.default for f in fields(KubernetesOptions) if f.name == "code_dir")
# AWS instance types whose GPUs reach each other over EFA (NCCL over sockets otherwise): p4d/p4de, p5/p5e/p5en, p6.
EFA_INSTANCE_TYPE = re.compile(r"^(p4d|p4de|p5|p5e|p5en|p6|p6e|p6-[a-z0-9]+|p6e-[a-z0-9]+)\.")
INSTANCE_TYPE_LABELS = ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type")


def check_stages_in_image(request: JobRequest, options: KubernetesOptions, image: str) -> None:
    """ConfigError (exit 2) for a Bridge training that would run stages/ from a stock NGC image, which has none at
    the in-image default code_dir: its pods would fail at once, after the image's pull, with "No such file"."""
    if not trains_with_bridge(request, "kubernetes") or not STOCK_NGC_IMAGE.match(image):
        return
    if options.code_dir.rstrip("/") != IN_IMAGE_CODE_DIR:
        return
    raise request.stage.where("kubernetes").error(
        f"{request.label}: Megatron-Bridge would run {IN_IMAGE_CODE_DIR}/bridge_pretrain.py in the stock image "
        f"{image}, which has no {IN_IMAGE_CODE_DIR} (backends.kubernetes.code_dir's default: stages/ baked into "
        "the image): build an image FROM it with this checkout's stages/ copied to that folder and set "
        "kubernetes.image to it, or copy stages/ onto the workspace claim and set backends.kubernetes.code_dir to "
        'that folder as the pods mount it (docs/backends/kubernetes.md, "Where the pods find stages/")'
    )


def efa_warning(request: JobRequest, gpus: int) -> str | None:
    """A warning for GPU pods without `efa` whose node selector names an EFA instance type (None otherwise)."""
    res: KubernetesResources = request.resources("kubernetes")
    if not gpus or res.efa:
        return None
    named = next((res.node_selector[key] for key in INSTANCE_TYPE_LABELS if key in res.node_selector), "")
    if not EFA_INSTANCE_TYPE.match(named):
        return None
    return (
        f"stage {request.stage.name}: its GPU pods run on {named}, an EFA instance type, but ask for no EFA "
        "device: NCCL would fall back to TCP sockets between pods; set kubernetes.efa (p4d/p4de: 4, p5: 32)"
    )
