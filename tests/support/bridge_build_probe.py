"""Build what a rendered Megatron-Bridge job trains, on CPU, with NVIDIA's own code: run by the Bridge test
environment's Python, in a process of its own, by tests/bridge/test_bridge_build.py (tests/support/bridge_build.py).

    python bridge_build_probe.py CASES.json     # [{"name", "what": "model"|"scheduler", "argv", "world_size"}]

Each case's `argv` is the entry program's (stages/bridge_pretrain.py: its own parser and `build_config`), so the
config is resolved exactly as its `--dry-run` resolves it: the recipe, `process_config_with_overrides`, then
`runtime_config_update` for `world_size` ranks; the vocabulary size is set as Bridge's setup() sets it. Then, as
rank 0 of that world:

- `model`: the model, through Bridge's `provide_distributed_model` and megatron-core's construction code, with
  Bridge's default (Transformer Engine) layer spec, over the TE STAND-IN in build mode
  (tests/fakes/transformer_engine_standin.py, installed in this process only): each of megatron-core's TE
  extension classes runs its __init__ (TENorm: __new__) up to its call into TE; there the stand-in stops it
  (ReachedTransformerEngine), the probe counts it and leaves an empty module in its place, so that the parent's
  construction goes on. The result: which TE constructors were reached how often, with what arguments, and
  megatron-core's own parameters (embeddings, output layer: TE's modules would create the rest).
- `scheduler`: the same model, megatron-core's parameter groups of it (`_get_param_groups`, with Bridge's
  weight-decay overrides), a plain torch AdamW over them (megatron-core's optimizers need CUDA), and Bridge's own
  scheduler construction (`megatron.bridge.training.optim._get_scheduler`: megatron-core's OptimizerParamScheduler,
  whose __init__ applies step 0): the weight decay each group then has.

Honest limits: the process group is torch's FAKE backend (the ranks pretended, no communication), so the parallel
state and every shape are rank 0's of the real layout; no gloo groups (the fake backend has none); parameters are
on the meta device (Bridge's own `init_model_with_meta_device`, with `use_cpu_initialization`: nothing allocated or
initialised); the DDP wrapper (CUDA buffers) and the CUDA RNG seeding are not run. Whatever NVIDIA's code refuses
in a case is its result (`{"error": type, "message": ...}`), and the next case starts from a fresh parallel state.

Prints one line last: `# bridge_build_probe: {case name: result}`.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MARKER = "# bridge_build_probe:"


def report(result: dict) -> None:
    print(f"{MARKER} {json.dumps(result, sort_keys=True)}", flush=True)


def resolved_config(argv: list[str], world_size: int):
    from bridge_pretrain import build_config, overrides_of, parse_args
    from megatron.bridge.training.config import runtime_config_update
    from megatron.bridge.training.setup import _validate_and_set_vocab_size

    args = parse_args(argv)
    os.environ["WORLD_SIZE"] = str(world_size)
    os.environ["RANK"] = "0"
    config = build_config(args.recipe, overrides_of(args))
    runtime_config_update(config)
    # The model's vocabulary as Bridge's setup() sets it from the tokenizer. Bridge 0.6.2 builds a GPT2BPETokenizer
    # through Hugging Face's AutoTokenizer("gpt2"), which needs the Hub; its size is that of the job's vocab_file
    # (GPT-2's encoder: one id a entry), read here.
    tokenizer_size = len(json.loads(Path(config.tokenizer.vocab_file).read_text(encoding="utf-8")))
    config.model.vocab_size, config.model.should_pad_vocab = _validate_and_set_vocab_size(
        model_vocab_size=config.model.vocab_size,
        tokenizer_vocab_size=tokenizer_size,
        use_tokenizer_vocab_size=getattr(config.tokenizer, "use_tokenizer_vocab_size", False),
    )
    return config


def fake_world(world_size: int) -> None:
    """torch.distributed as rank 0 of `world_size` over torch's fake process group (no communication)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)


REACHED: Counter = Counter()  # "<megatron-core class> -> transformer_engine.<TE name>": calls, in this case


def stop_at_transformer_engine() -> None:
    """Each of megatron-core's TE extension classes, when it is the class being built: its own __init__ (or, for
    TENorm, __new__) runs; at its call into TE the stand-in raises ReachedTransformerEngine, and an empty module
    takes its place, so that the parent's construction goes on. Once a process."""
    from megatron.core.extensions import transformer_engine as extensions

    for cls in [c for c in vars(extensions).values() if isinstance(c, type) and c.__module__ == extensions.__name__]:
        own = vars(cls)
        if "__init__" in own and not getattr(own["__init__"], "stops_at_te", False):
            cls.__init__ = stopping_init(cls, own["__init__"])
        elif "__new__" in own and "__init__" not in own:  # TENorm: it returns TE's own module
            new = getattr(own["__new__"], "__func__", own["__new__"])
            if not getattr(new, "stops_at_te", False):
                cls.__new__ = stopping_new(cls, new)


def stopping_init(cls: type, init):
    import torch
    from transformer_engine_standin import ReachedTransformerEngine

    def wrapped(self, *args, **kwargs):
        if type(self) is not cls:  # a subclass's super().__init__(): the class being built stops
            return init(self, *args, **kwargs)
        try:
            init(self, *args, **kwargs)
        except ReachedTransformerEngine as stop:
            REACHED[f"{cls.__name__} -> transformer_engine.{stop.name}"] += 1
            torch.nn.Module.__init__(self)
            return None
        raise AssertionError(f"{cls.__name__} was built without calling Transformer Engine")

    wrapped.stops_at_te = True
    return wrapped


def stopping_new(cls: type, new):
    import torch
    from transformer_engine_standin import ReachedTransformerEngine

    def wrapped(klass, *args, **kwargs):
        try:
            new(klass, *args, **kwargs)
        except ReachedTransformerEngine as stop:
            REACHED[f"{cls.__name__} -> transformer_engine.{stop.name}"] += 1
            return torch.nn.Module()
        raise AssertionError(f"{cls.__name__} was built without calling Transformer Engine")

    wrapped.stops_at_te = True
    return staticmethod(wrapped)


def build_model(config):
    """Rank 0's model chunks, as Bridge's setup() builds them (`provide_distributed_model`), on the meta device and
    without the DDP wrapper."""
    if config.model.cpu_offloading:
        raise RuntimeError(
            "bridge_build_probe: a model that offloads to the CPU cannot be proven here (the TE "
            "stand-in does not serve TE's cpu_offload)"
        )
    fake_world(int(os.environ["WORLD_SIZE"]))
    import transformer_engine_standin

    stop_at_transformer_engine()
    REACHED.clear()
    transformer_engine_standin.reached.clear()
    config.model.initialize_model_parallel(seed=None, create_gloo_process_groups=False)  # gloo: no fake one
    return config.model.provide_distributed_model(
        ddp_config=config.ddp,
        wrap_with_ddp=False,
        use_cpu_initialization=True,
        init_model_with_meta_device=True,
        overlap_param_gather_with_optimizer_step=config.optimizer.overlap_param_gather_with_optimizer_step,
        data_parallel_random_init=config.rng.data_parallel_random_init,
    )


def model(argv: list[str], world_size: int) -> dict:
    config = resolved_config(argv, world_size)
    chunks = build_model(config)
    parameters = sum(p.numel() for chunk in chunks for p in chunk.parameters())
    modules = Counter(type(m).__name__ for chunk in chunks for m in chunk.modules())
    from megatron.core import parallel_state

    return {
        "reached": dict(REACHED),
        "te_calls": te_calls(),
        "parameters": parameters,
        "modules": dict(modules),
        "tensor_parallel": parallel_state.get_tensor_model_parallel_world_size(),
        "data_parallel": parallel_state.get_data_parallel_world_size(),
        "apply_query_key_layer_scaling": config.model.apply_query_key_layer_scaling,
    }


def te_calls() -> dict[str, list[dict]]:
    """Each TE constructor's distinct plain arguments (numbers, strings, flags; not the layer number), as the
    stand-in bound them."""
    import transformer_engine_standin

    found: dict[str, list[dict]] = {}
    for name, arguments in transformer_engine_standin.reached:
        plain = {
            k: v
            for k, v in arguments.items()
            if k != "layer_number" and (isinstance(v, (bool, int, float, str)) or v is None)
        }
        if plain not in found.setdefault(name, []):
            found[name].append(plain)
    return found


def scheduler(argv: list[str], world_size: int) -> dict:
    import torch
    from megatron.bridge.training.config import OptimizerConfigOverrideProvider, OptimizerConfigOverrideProviderContext
    from megatron.bridge.training.optim import _get_scheduler
    from megatron.core.optimizer import _get_param_groups

    config = resolved_config(argv, world_size)
    chunks = build_model(config)
    overrides = OptimizerConfigOverrideProvider().build_config_overrides(
        OptimizerConfigOverrideProviderContext(config.scheduler, config.optimizer, chunks)
    )
    groups = _get_param_groups(chunks, config.optimizer, overrides)
    optimizer = torch.optim.AdamW(groups, lr=config.optimizer.lr, weight_decay=config.optimizer.weight_decay)
    _get_scheduler(config.optimizer, config.scheduler, optimizer)  # its __init__ applies step 0
    return {
        "optimizer.weight_decay": config.optimizer.weight_decay,
        "groups": [
            {
                "weight_decay": g["weight_decay"],
                "wd_mult": g.get("wd_mult", 1.0),
                "lr": g["lr"],
                "parameters": sum(p.numel() for p in g["params"]),
            }
            for g in optimizer.param_groups
        ],
    }


def run_case(case: dict) -> dict:
    from megatron.core import parallel_state

    try:
        if case["what"] == "model":
            return model(case["argv"], case["world_size"])
        return scheduler(case["argv"], case["world_size"])
    except (Exception, SystemExit) as exc:  # what NVIDIA's code (or the entry program) refused, for the test
        traceback.print_exc()
        return {"error": type(exc).__name__, "message": str(exc)}
    finally:  # the next case starts from no parallel state and no process group, as a fresh job does
        parallel_state.destroy_model_parallel()
        if torch_distributed().is_initialized():
            torch_distributed().destroy_process_group()


def torch_distributed():
    import torch.distributed

    return torch.distributed


def main(argv: list[str]) -> int:
    """A JSON file of cases, [{"name", "what": "model"|"scheduler", "argv", "world_size"}], run one after the other
    in this process (one import of Bridge for all). Prints `# bridge_build_probe: {name: result}`."""
    cases = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    sys.path[:0] = [str(REPO / "stages"), str(REPO / "tests" / "fakes")]
    import transformer_engine_standin

    transformer_engine_standin.install_build()  # before megatron is imported
    report({case["name"]: run_case(case) for case in cases})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
