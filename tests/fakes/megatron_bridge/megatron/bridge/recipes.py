"""The one recipe the bundled pipelines use, with the recipe's own defaults where they matter to a run: the shared
checkpoint folder every recipe defaults to, keeping every checkpoint, no time limit."""

from __future__ import annotations

from megatron.bridge.training.config import ConfigContainer


def vanilla_gpt_pretrain_config() -> ConfigContainer:
    return ConfigContainer.recipe_defaults()
