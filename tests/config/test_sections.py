"""Every backend section of the table answers the hooks that config/, report/ and cli/ ask instead of its name
(config/sections/hooks.py): checked by what the hooks name, so a new backend's section is checked without an edit."""

from __future__ import annotations

import dataclasses

import pytest

from bcp_pipeline.config.model import StageConfig, VerificationResources
from bcp_pipeline.config.resources import BACKENDS, RESOURCE_TYPES
from bcp_pipeline.config.sections.hooks import Resources
from bcp_pipeline.config.sections.kubernetes import KubernetesResources

FIELD_HOOKS = ("image_field", "gpus_field", "nodes_field", "instance_field")


def fields_missing(resources: type) -> list[str]:
    """The fields the section's hooks (and its `counts`) name that it does not have."""
    fields = {f.name for f in dataclasses.fields(resources)}
    named = [getattr(resources, hook) for hook in FIELD_HOOKS] + list(resources.counts)
    return [name for name in named if name is not None and name not in fields]


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_a_section_of_the_table_answers_every_hook_with_fields_it_has(backend):
    resources = RESOURCE_TYPES[backend]
    assert issubclass(resources, Resources) and dataclasses.is_dataclass(resources)
    assert resources.rank_layout is not Resources.rank_layout, f"{resources.__name__} has no rank_layout"
    assert fields_missing(resources) == []
    assert not resources.gpus_are_ranks or resources.gpus_field  # ranks of which field?
    for holder in (StageConfig, VerificationResources):
        assert {f.name: f.type for f in dataclasses.fields(holder)}.get(backend) == resources.__name__, holder


def test_the_checks_above_catch_a_hook_naming_a_field_the_section_lacks():
    broken = type("Broken", (KubernetesResources,), {"nodes_field": "pods", "counts": ("cpu", "gpu")})
    assert fields_missing(broken) == ["pods", "gpu"]


def test_the_defaults_say_nothing_of_a_section_that_sets_no_hook():
    @dataclasses.dataclass(kw_only=True)
    class Plain(Resources):
        image: str | None = None

    plain = Plain(image="nvcr.io/nvidia/nemo:24.05")
    assert (plain.launcher_image(), plain.instance_name(), plain.node_label(), plain.declared_cores()) == (
        None,
        None,
        None,
        None,
    )  # image_field unset: the image is not the launcher's
    assert plain.validate(None, lambda key: None) is None
    with pytest.raises(NotImplementedError, match="Plain has no rank_layout"):
        plain.rank_layout(RESOURCE_TYPES["bcp"]())
