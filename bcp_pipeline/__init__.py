"""bcp-pipeline: run a SlimPajama -> NeMo GPT pretraining DAG on NGC Base Command Platform, Slurm or locally."""

__version__ = "0.1.0"
