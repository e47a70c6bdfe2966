"""STAND-IN for NVIDIA's NeMo launcher (`launcher_scripts/main.py`), NOT NVIDIA's code: for `bcp-pipeline check`'s
NeMo probe on the NGC API emulator, where no NeMo image exists.

Like the real launcher it is a Hydra application over `conf/config.yaml`, whose `training` group holds
`gpt3/126m` and `gpt3/7b_improved`. The probe only ever runs it with Hydra's `--cfg job`, so real Hydra
(hydra-core) composes the config with the probe's overrides and prints it: an unknown key, a bad override or a
missing config is refused by Hydra exactly as it would be in the image. Run without `--cfg` it trains nothing: it
says so and exits 2.
"""

import sys

import hydra


@hydra.main(config_path="conf", config_name="config", version_base=None)
def main(cfg) -> None:
    print("NeMo launcher STAND-IN (tests/fakes/nemo_launcher): it composes configs for `--cfg job` only and "
          "trains nothing", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    main()
