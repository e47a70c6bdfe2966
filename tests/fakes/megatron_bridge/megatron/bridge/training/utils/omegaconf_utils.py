"""KEY=VALUE overrides, applied as Bridge applies them: a key the config lacks is an error, values are parsed as
OmegaConf parses them (numbers, booleans, null, lists, quoted strings)."""

from __future__ import annotations

import yaml

from megatron.bridge.training.config import SCALARS, SECTIONS, ConfigContainer


class OverridesError(Exception):
    pass


def process_config_with_overrides(config: ConfigContainer, cli_overrides: list[str]) -> ConfigContainer:
    for override in cli_overrides:
        key, _, text = override.partition("=")
        section, _, name = key.lstrip("+~").partition(".")
        if not name and section in SCALARS:
            setattr(config, section, yaml.safe_load(text) if text else None)
            continue
        if section not in SECTIONS or name not in SECTIONS[section]:
            raise OverridesError(
                f"Failed to apply override {override!r}: Key '{name or section}' not in '{section}' (ConfigContainer)"
            )
        value = yaml.safe_load(text) if text else None
        if isinstance(value, str):
            try:
                value = float(value)  # 1e-05: a number to OmegaConf, a string to YAML 1.1
            except ValueError:
                pass
        setattr(getattr(config, section), name, value)
    return config
