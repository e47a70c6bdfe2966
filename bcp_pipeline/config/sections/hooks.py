"""What every backend's section of a stage answers for the code outside the backend's folder: `Resources`, the
hooks config/, report/ and cli/ ask instead of a backend's name (with their defaults), and `RankLayout`, what one of
them returns. Each backend's sections are a module of this folder; config/resources.py's BACKENDS lists them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from bcp_pipeline.config.typed import Where


@dataclass(frozen=True)
class RankLayout:
    """How a job's ranks are laid out on one backend: `nodes` x `per_node` processes, RANK 0..world_size-1."""

    nodes: int
    per_node: int

    @property
    def world_size(self) -> int:
        return self.nodes * self.per_node


class Resources:
    """What a stage's section of one backend answers to the code outside the backend's folder (config/, report/,
    cli/ ask these, never the backend's name), with defaults for a backend that has nothing to say. Every section
    of the table subclasses it; docs/backends/adding-a-backend.md says which hooks a new one must set."""

    counts: ClassVar[tuple[str, ...]] = ()  # fields counting nodes, processes or CPUs: each refused below 1 (load)
    image_field: ClassVar[str | None] = None  # the field naming the stage's container image (output digest); None:
    # the jobs run in no container
    digest_unset_image: ClassVar[bool] = True  # an unset image enters the output digest too; a backend added later
    # says False, so that adding it leaves every digest (and the runs made under them) as it was
    gpus_field: ClassVar[str | None] = None  # the field giving a training's GPUs (ranks) a node; None: the backend
    # declares none, and the BCP instance's count is taken
    gpus_are_ranks: ClassVar[bool] = False  # gpus_field counts ranks (torchrun's --nproc-per-node), not GPUs asked
    # for: a data job asks for none, and a NeMo training's GPUs a node are its ranks a node
    nodes_field: ClassVar[str | None] = None  # the field counting a job's nodes, unset: bcp.replicas; set (or
    # gpus_field set), NeMo's preflight checks the training's sizes against this backend's nodes
    instance_field: ClassVar[str | None] = None  # the field naming the node type the job runs on, one of
    # backends.bcp.instances (BCP's instance); None: the section names no node type, the estimates assume bcp.instance
    runs_here: ClassVar[bool] = False  # the jobs are processes of this machine, in the orchestrator's environment
    # (its Hugging Face token and cache), on no node the estimates could look up; a Bridge data index there runs
    # the local stand-in (bridge_index.py)

    def rank_layout(self, bcp: Any) -> RankLayout:  # bcp: the stage's BcpResources (sections/bcp.py)
        """Nodes x processes a node, taking each unset count from the stage's `bcp` section (required)."""
        raise NotImplementedError(f"{type(self).__name__} has no rank_layout")

    def launcher_image(self) -> str | None:
        """The image the NeMo launcher runs in on this backend, whose tag tells its release; None: the section names
        none, and bcp.image (the pipeline's NeMo image) is the best guess."""
        return getattr(self, self.image_field) if self.image_field else None

    def instance_name(self) -> str | None:
        """The node type the section names (`instance_field`), None where it names none."""
        return getattr(self, self.instance_field) if self.instance_field else None

    def node_label(self) -> str | None:
        """What `plan`'s INSTANCE column calls the job's node where the section names it in its own terms."""
        return None

    def declared_cores(self) -> int | None:
        """A node's CPU cores as the section asks for them; None: it does not say (bcp.instance's are taken)."""
        return None

    def validate(self, stage: Any, at: Callable[[str | None], Where]) -> None:
        """What the section's keys mean together, checked at load (after the types): raise `at(KEY).error(...)`,
        `at(KEY)` being the key's line or --set where it is written, else the stage's; `at(None)` the section's."""
