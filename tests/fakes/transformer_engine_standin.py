"""STAND-IN for NVIDIA Transformer Engine on a machine without a GPU (TE is CUDA only and does not install here).

Megatron Core probes for TE and falls back without it, as it does on any CPU machine. One module of megatron-bridge
0.6.2, megatron/bridge/peft/lora_layers.py, imports `transformer_engine.pytorch` unconditionally (for its LoRA
layers, which building a pretraining config never calls), so nothing of Megatron-Bridge imports without TE. This
stand-in gives TE to that one import, as placeholder modules whose classes fail loudly when used, and to nothing
else: while lora_layers executes `import transformer_engine...` succeeds; at any other time it raises
ModuleNotFoundError, and the placeholder modules leave sys.modules once lora_layers is loaded.
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
        raise RuntimeError(f"{type(self).__name__} of the Transformer Engine STAND-IN was used: it only lets "
                           f"{IMPORTER} import, for building configs")


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
                raise ModuleNotFoundError(f"No module named {fullname!r} (Transformer Engine STAND-IN: absent)",
                                          name=fullname)
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
