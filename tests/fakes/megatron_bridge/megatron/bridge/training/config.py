"""The ConfigContainer as far as a run's settings go: sections of known keys, so that an override of a key Bridge's
config lacks is refused, as Bridge refuses it (its OmegaConf structured config). The keys are those of
megatron-bridge 0.6.2's dataclasses that the renderer sets, or that the stand-in reads; the real-Bridge tests
(tests/bridge/) check the renderer's keys against the real classes."""

from __future__ import annotations

import copy
import os

import yaml

SECTIONS: dict[str, dict[str, object]] = {
    "model": {
        "num_layers": 2,
        "hidden_size": 256,
        "ffn_hidden_size": 1024,
        "num_attention_heads": 0,
        "seq_length": 1024,
        "tensor_model_parallel_size": 1,
        "pipeline_model_parallel_size": 1,
        "context_parallel_size": 1,
        "activation_func": "gelu",
        "gated_linear_unit": False,
        "position_embedding_type": "learned_absolute",
        "rotary_percent": 1.0,
        "normalization": "LayerNorm",
        "layernorm_zero_centered_gamma": False,
        "add_bias_linear": True,
        "share_embeddings_and_output_weights": True,
        "hidden_dropout": 0.1,
        "attention_dropout": 0.1,
        "init_method_std": 0.02,
        "layernorm_epsilon": 1e-5,
        "make_vocab_size_divisible_by": 128,
        "apply_query_key_layer_scaling": False,
        "cpu_offloading": False,
        "cpu_offloading_num_layers": 0,
        "cpu_offloading_activations": True,
        "cpu_offloading_weights": False,
    },
    "train": {
        "global_batch_size": 32,
        "micro_batch_size": 1,
        "train_iters": 1000,
        "exit_duration_in_mins": None,
        "exit_signal_handler": False,
        "exit_interval": None,
    },
    "dataset": {
        "data_path": None,
        "blend": None,
        "blend_per_split": None,
        "seq_length": 1024,
        "path_to_cache": None,
        "split": "9999,8,2",
    },
    "tokenizer": {"tokenizer_type": "NullTokenizer", "vocab_file": None, "merge_file": None},
    "checkpoint": {
        "save": "nemo_experiments/default/checkpoints",
        "load": "nemo_experiments/default/checkpoints",
        "save_interval": 500,
        "most_recent_k": -1,
        "ckpt_format": "torch_dist",
        "async_save": False,
        "ckpt_step": None,
        "load_optim": True,
        "load_rng": True,
    },
    "logger": {"log_throughput": False, "log_interval": 10, "tensorboard_dir": None},
    "optimizer": {
        "lr": 3e-4,
        "min_lr": 3e-5,
        "weight_decay": 0.01,
        "adam_beta1": 0.9,
        "adam_beta2": 0.999,
        "clip_grad": 1.0,
    },
    "scheduler": {
        "lr_decay_style": "cosine",
        "lr_warmup_iters": 2000,
        "start_weight_decay": 0.033,
        "end_weight_decay": 0.033,
    },
    "ddp": {
        "overlap_grad_reduce": False,
        "overlap_param_gather": False,
        "average_in_collective": False,
        "use_megatron_fsdp": False,
        "data_parallel_sharding_strategy": "no_shard",
    },
    "dist": {"distributed_timeout_minutes": 10},
    "rng": {"seed": 1234},
    "validation": {"eval_interval": 1000, "eval_iters": 10, "skip_train": False},
    "profiling": {"use_nsys_profiler": False, "profile_step_start": 10, "profile_step_end": 12, "profile_ranks": [0]},
}


# Top-level keys that are no section: the mixed-precision recipe's name (Bridge resolves it in runtime_config_update)
SCALARS: dict[str, object] = {"mixed_precision": "bf16_mixed"}
# The recipe's process environment (ConfigContainer.env_vars), as vanilla_gpt_pretrain_config's COMMON_RECIPE_ENV_VARS
RECIPE_ENV_VARS: dict[str, object] = {
    "NCCL_GRAPH_REGISTER": 0,
    "NCCL_NVLS_ENABLE": 0,
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    "TORCH_NCCL_AVOID_RECORD_STREAMS": 1,
    "TORCH_NCCL_HIGH_PRIORITY": 1,
}


class Section:
    def __init__(self, name: str, values: dict[str, object]):
        self.__dict__.update(values)
        self._name = name

    def as_dict(self) -> dict[str, object]:
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}


class ConfigContainer:
    def __init__(self, sections: dict[str, dict[str, object]]):
        for name, values in sections.items():
            setattr(self, name, Section(name, copy.deepcopy(values)))
        for name, value in SCALARS.items():
            setattr(self, name, value)
        self.env_vars = dict(RECIPE_ENV_VARS)

    @classmethod
    def recipe_defaults(cls) -> ConfigContainer:
        return cls(SECTIONS)

    def sections(self) -> dict[str, Section]:
        return {name: getattr(self, name) for name in SECTIONS}

    def print_yaml(self) -> None:
        print(
            yaml.safe_dump(
                {
                    **{name: section.as_dict() for name, section in self.sections().items()},
                    **{name: getattr(self, name) for name in SCALARS},
                    "env_vars": self.env_vars,
                },
                sort_keys=True,
            ),
            end="",
        )


def runtime_config_update(config: ConfigContainer) -> None:
    """What pretrain() does first: the recipe's environment (setdefault: the launcher's values win), the data list
    becomes a blend, and the checks Bridge makes itself."""
    for name, value in config.env_vars.items():
        os.environ.setdefault(name, str(value))
    data = config.dataset
    if data.data_path:
        flat = list(data.data_path)
        data.blend = [flat[1::2], [float(w) for w in flat[0::2]]]
    if config.model.seq_length != data.seq_length:
        raise AssertionError(
            "Please ensure sequence length configuration in model config and dataset config match.\n"
            f"Sequence length in model config: {config.model.seq_length}, Sequence length in "
            f"dataset config: {data.seq_length}"
        )
    world = int(os.environ.get("WORLD_SIZE", "1"))
    model = config.model
    parallel = model.tensor_model_parallel_size * model.pipeline_model_parallel_size * model.context_parallel_size
    if world % parallel:
        raise RuntimeError(
            f"world size ({world}) is not divisible by tensor_model_parallel_size x "
            f"pipeline_model_parallel_size x context_parallel_size ({parallel})"
        )
