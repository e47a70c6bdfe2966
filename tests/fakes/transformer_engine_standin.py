"""STAND-IN for NVIDIA Transformer Engine on a machine without a GPU (TE is CUDA only and does not install here).

Megatron Core probes for TE and falls back without it, as it does on any CPU machine. One module of megatron-bridge
0.6.2, megatron/bridge/peft/lora_layers.py, imports `transformer_engine.pytorch` unconditionally (for its LoRA
layers, which building a pretraining config never calls), so nothing of Megatron-Bridge imports without TE. This
stand-in gives TE to that one import, as placeholder modules whose classes fail loudly when used, and to nothing
else: while lora_layers executes `import transformer_engine...` succeeds; at any other time it raises
ModuleNotFoundError, and the placeholder modules leave sys.modules once lora_layers is loaded.

That is the default (`install()`, from the .pth line scripts/bridge-venv writes): megatron-core then sees no TE, as
on any CPU machine, and the dry-run tests see exactly that.

BUILD MODE (`install_build()`, called only by tests/support/bridge_build_probe.py in its own process, before
megatron is imported): TE is present for every importer, answering version queries as Transformer Engine
TE_VERSION (chosen: a release megatron-core 0.19 supports; not known to be the one in a given NeMo image), so
megatron-core's TE extension classes (megatron/core/extensions/transformer_engine.py) are defined over this
stand-in's base classes and the model is built with Bridge's default, Transformer Engine, layer spec. Every call
into TE stops: a stand-in class's constructor first binds its arguments to TE's own parameter list at TE_VERSION
(TE_SIGNATURES, the names from TE's source at that tag: an argument TE does not take raises TypeError, as TE's
would), records the call in `reached`, then raises ReachedTransformerEngine. Calling any other TE name (a function,
a recipe) raises it too. Never kinder than TE: nothing TE would refuse is accepted, nothing TE computes is faked;
what TE itself checks inside its constructors (for example heads divisible by the TP size) is not run here, and an
import of a name TE lacks at that version succeeds (using it stops the same way).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

TE = "transformer_engine"
IMPORTER = "megatron.bridge.peft.lora_layers"
_serving = False


class _Placeholder:
    def __init__(self, *args, **kwargs):
        raise RuntimeError(
            f"{type(self).__name__} of the Transformer Engine STAND-IN was used: it only lets "
            f"{IMPORTER} import, for building configs"
        )


class _PlaceholderModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        if name == "ops":
            return _PlaceholderModule(f"{self.__name__}.ops")
        return type(name, (_Placeholder,), {"__module__": self.__name__})


class _Hook(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname == TE or fullname.startswith(TE + "."):
            if not _serving:
                raise ModuleNotFoundError(
                    f"No module named {fullname!r} (Transformer Engine STAND-IN: absent)", name=fullname
                )
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        if fullname == IMPORTER:
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            if spec is not None:
                spec.loader = _Serving(spec.loader)
            return spec
        return None

    def create_module(self, spec):
        module = _PlaceholderModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        return None


class _Serving(importlib.abc.Loader):
    """The real loader of lora_layers, with TE there only while it runs."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        global _serving
        _serving = True
        try:
            self.loader.exec_module(module)
        finally:
            _serving = False
            for name in [n for n in sys.modules if n == TE or n.startswith(TE + ".")]:
                del sys.modules[name]


def install() -> None:
    if not any(isinstance(finder, _Hook) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Hook())


# -- build mode ---------------------------------------------------------------------------------------------------
TE_VERSION = "2.14.0"
# TE's constructors at v2.14 (NVIDIA/TransformerEngine, transformer_engine/pytorch/...): (required, optional)
# parameter names, in order; LayerNorm and RMSNorm also take **kwargs.
_LINEAR_TAIL = (
    "sequence_parallel",
    "fuse_wgrad_accumulation",
    "tp_group",
    "tp_size",
    "get_rng_state_tracker",
    "rng_tracker_name",
    "init_method",
    "bias",
    "return_bias",
    "params_dtype",
    "parallel_mode",
)
TE_SIGNATURES: dict[str, tuple[tuple[str, ...], tuple[str, ...], bool]] = {
    "pytorch.Linear": (
        ("in_features", "out_features"),
        _LINEAR_TAIL
        + (
            "parameters_split",
            "device",
            "ub_overlap_ag",
            "ub_overlap_rs",
            "ub_overlap_rs_dgrad",
            "ub_bulk_dgrad",
            "ub_bulk_wgrad",
            "ub_name",
            "delay_wgrad_compute",
            "symmetric_ar_type",
            "save_original_input",
            "name",
        ),
        False,
    ),
    "pytorch.LayerNormLinear": (
        ("in_features", "out_features"),
        (
            "eps",
            "sequence_parallel",
            "fuse_wgrad_accumulation",
            "tp_group",
            "tp_size",
            "get_rng_state_tracker",
            "init_method",
            "bias",
            "normalization",
            "return_bias",
            "params_dtype",
            "parallel_mode",
            "return_layernorm_output",
            "return_layernorm_output_gathered",
            "parameters_split",
            "zero_centered_gamma",
            "device",
            "ub_overlap_ag",
            "ub_overlap_rs",
            "ub_overlap_rs_dgrad",
            "ub_bulk_wgrad",
            "ub_bulk_dgrad",
            "ub_name",
            "delay_wgrad_compute",
            "symmetric_ar_type",
            "name",
        ),
        False,
    ),
    "pytorch.DotProductAttention": (
        ("num_attention_heads", "kv_channels"),
        (
            "num_gqa_groups",
            "attention_dropout",
            "qkv_format",
            "attn_mask_type",
            "window_size",
            "bottom_right_diagonal",
            "sequence_parallel",
            "tp_size",
            "get_rng_state_tracker",
            "tp_group",
            "layer_number",
            "attention_type",
            "cp_group",
            "cp_global_ranks",
            "cp_stream",
            "cp_comm_type",
            "softmax_scale",
            "softmax_type",
            "return_max_logit",
            "name",
        ),
        False,
    ),
    "pytorch.LayerNorm": (
        (),
        ("normalized_shape", "eps", "sequence_parallel", "params_dtype", "zero_centered_gamma", "hidden_size"),
        True,
    ),
    "pytorch.RMSNorm": (
        (),
        ("normalized_shape", "eps", "sequence_parallel", "params_dtype", "zero_centered_gamma", "hidden_size"),
        True,
    ),
    "pytorch.GroupedLinear": (
        ("num_gemms", "in_features", "out_features"),
        _LINEAR_TAIL
        + (
            "device",
            "ub_overlap_rs",
            "ub_overlap_ag",
            "ub_name",
            "delay_wgrad_compute",
            "save_original_input",
            "single_grouped_weight",
            "single_grouped_bias",
            "name",
        ),
        False,
    ),
}
# TE's submodules build mode does NOT serve. megatron-core calls pytorch.cpu_offload's get_cpu_offload_context while
# building every TransformerBlock, offloading on or off (real TE answers a null context when off): without it
# megatron-core takes its own path for a TE that lacks it, the same for a model that does not offload (the build
# probe refuses one that does: not provable here).
ABSENT = ("pytorch.cpu_offload", "pytorch.cpu_offload_v1")
# APEX's CUDA extension for the fused weight-gradient GEMM, which megatron-core's linear layers require when
# `gradient_accumulation_fusion` is on (the recipes' default, for the NeMo images that ship it): served the same way,
# import only; a call into it stops as a call into TE does.
APEX_WGRAD = "fused_weight_gradient_mlp_cuda"
reached: list[tuple[str, dict]] = []  # (TE name, its bound arguments), each call into TE in order


class ReachedTransformerEngine(Exception):
    """Megatron-core got as far as calling Transformer Engine itself: everything before that call ran and passed."""

    def __init__(self, name: str, arguments: dict):
        super().__init__(f"reached Transformer Engine: {name}({', '.join(sorted(arguments))})")
        self.name, self.arguments = name, arguments


def _bind(name: str, args: tuple, kwargs: dict) -> dict:
    required, optional, var_keyword = TE_SIGNATURES[name]
    params = required + optional
    if len(args) > len(params):
        raise TypeError(f"{name}.__init__() takes {len(params)} positional arguments but {len(args)} were given")
    bound = dict(zip(params, args))
    for key, value in kwargs.items():
        if key in bound:
            raise TypeError(f"{name}.__init__() got multiple values for argument {key!r}")
        if key not in params and not var_keyword:
            raise TypeError(f"{name}.__init__() got an unexpected keyword argument {key!r}")
        bound[key] = value
    missing = [p for p in required if p not in bound]
    if missing:
        raise TypeError(f"{name}.__init__() missing required argument(s): {', '.join(missing)}")
    return bound


def _reach(name: str, args: tuple, kwargs: dict):
    arguments = _bind(name, args, kwargs) if name in TE_SIGNATURES else {"args": args, **kwargs}
    reached.append((name, arguments))
    raise ReachedTransformerEngine(name, arguments)


class _StandinMeta(type):
    """A TE name's class: any attribute it lacks is a further TE name (`recipe.Format.HYBRID`)."""

    def __getattr__(cls, attribute: str):
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        return _standin_class(f"{cls._te_name}.{attribute}", cls.__module__)


_classes: dict[str, type] = {}


def _standin_class(name: str, module: str) -> type:
    if name not in _classes:
        import torch  # only in build mode: the default mode never imports torch

        # TE's modules are torch modules (megatron-core's subclasses rely on it); nn.Module's metaclass is plain
        # `type`, so _StandinMeta can be the class's
        base = torch.nn.Module if name in TE_SIGNATURES or ".ops." in name else object

        def __init__(self, *args, **kwargs):
            _reach(name, args, kwargs)

        _classes[name] = _StandinMeta(
            name.rsplit(".", 1)[-1], (base,), {"__init__": __init__, "__module__": module, "_te_name": name}
        )
    return _classes[name]


class _BuildModule(types.ModuleType):
    def __getattr__(self, attribute: str):
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        full = f"{self.__name__}.{attribute}"
        if full.removeprefix(TE + ".") in ABSENT:
            raise AttributeError(attribute)
        if full in sys.modules:
            return sys.modules[full]
        return _standin_class(full.removeprefix(TE + "."), self.__name__)  # TE names: without "transformer_engine."


class _BuildHook(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname == APEX_WGRAD:
            return importlib.machinery.ModuleSpec(fullname, self)
        if fullname == TE or fullname.startswith(TE + "."):
            if fullname.removeprefix(TE + ".") in ABSENT:
                raise ModuleNotFoundError(
                    f"No module named {fullname!r} (Transformer Engine STAND-IN: not served)", name=fullname
                )
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _BuildModule(spec.name)
        if spec.name != APEX_WGRAD:
            module.__path__ = []
        if spec.name == TE:
            module.__version__ = TE_VERSION
        return module

    def exec_module(self, module):
        parent, _, child = module.__name__.rpartition(".")
        if parent in sys.modules:
            setattr(sys.modules[parent], child, module)


def install_build() -> None:
    """Build mode (see the module's docstring), in front of the default hook; before megatron is imported."""
    if not any(isinstance(finder, _BuildHook) for finder in sys.meta_path):
        sys.meta_path.insert(0, _BuildHook())
