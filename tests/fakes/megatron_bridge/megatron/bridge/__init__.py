"""STAND-IN for NVIDIA's Megatron-Bridge (tests/fakes/README.md, "The Megatron-Bridge stand-in"): the public API the
entry program stages/bridge_pretrain.py uses, on a machine with no GPU and no NeMo image. It trains no model."""
