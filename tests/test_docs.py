"""The README and docs/: every page is reachable from the README, every link lands on a file (and heading) that
exists, and the README stays a front page (under 300 lines) that starts with its two commands."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, spaces to `-`."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", text))


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    found: set[str] = set()
    for heading in re.findall(r"^#{1,6}\s+(.+)$", text, re.M):
        name, number = slug(heading), 1
        while name in found:  # a repeated heading gets -1, -2, ... as GitHub numbers it
            name = f"{slug(heading)}-{number}"
            number += 1
        found.add(name)
    return found


def links(page: Path) -> list[str]:
    return LINK.findall(FENCE.sub("", page.read_text(encoding="utf-8")))


def broken_links(page: Path) -> list[str]:
    """Links of `page` to a file or heading that does not exist (web links are not followed)."""
    found = []
    for target in links(page):
        if re.match(r"[a-z]+://|mailto:", target):
            continue
        path_text, _, anchor = target.partition("#")
        path = (page.parent / path_text).resolve() if path_text else page
        if not path.exists():
            found.append(f"{page.name}: {target} (no such file)")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            found.append(f"{page.name}: {target} (no such heading)")
    return found


def test_every_link_lands_on_a_file_and_heading_that_exist():
    assert [problem for page in pages() for problem in broken_links(page)] == []


def test_every_docs_page_is_reachable_from_the_readme():
    seen, todo = set(), [REPO / "README.md"]
    while todo:
        page = todo.pop()
        if page in seen:
            continue
        seen.add(page)
        for target in links(page):
            path_text = target.partition("#")[0]
            path = (page.parent / path_text).resolve() if path_text else page
            if path.suffix == ".md" and path.is_file() and REPO in path.parents:
                todo.append(path)
    unreachable = [str(page.relative_to(REPO)) for page in pages() if page not in seen]
    assert unreachable == []


def test_the_readme_is_a_front_page_that_starts_with_its_two_commands():
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) < 300
    first_block = lines[lines.index("```bash") + 1: lines.index("```")]
    assert [line.split("#")[0].strip() for line in first_block] == [
        "scripts/setup && .venv/bin/bcp-pipeline run demo",
        "scripts/setup --test && .venv/bin/python -m pytest"]


def test_the_checker_finds_a_broken_link_and_a_missing_heading(tmp_path):
    page = tmp_path / "a.md"
    (tmp_path / "b.md").write_text("# Title\n\n## The `plan` verb\n")
    page.write_text("[ok](b.md#the-plan-verb) [gone](c.md) [no heading](b.md#nope) [web](https://x.org/y)\n"
                    "```\n[in code](d.md)\n```\n")
    assert broken_links(page) == ["a.md: c.md (no such file)", "a.md: b.md#nope (no such heading)"]


def merged(base: dict, extra: dict) -> dict:
    """`extra` over `base`, mapping by mapping (as a user merges a docs example into the bundled pipelines.yaml)."""
    out = dict(base)
    for key, value in extra.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def test_the_eks_example_plans_and_every_pod_fits_its_node(tmp_path, capsys):
    """docs/backends/kubernetes.md's EKS example, merged over the bundled pipelines: it plans on Kubernetes, its data
    pods fit an m6i.4xlarge (16 vCPUs, ~57 GiB allocatable) with a process a vCPU, its training 4 x 8 GPUs."""
    import json

    import yaml

    from bcp_pipeline.cli.main import main

    page = (REPO / "docs" / "backends" / "kubernetes.md").read_text()
    example = yaml.safe_load(page.split("### An EKS example", 1)[1].split("```yaml", 1)[1].split("```", 1)[0])
    raw = merged(yaml.safe_load((REPO / "pipelines.yaml").read_text()), example)
    raw["stages_dir"] = str(REPO / "stages")
    config = tmp_path / "pipelines.yaml"
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    capsys.readouterr()
    assert main(["--config", str(config), "plan", "slimpajama-8b-bridge", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["backend"] == "kubernetes"
    pods = {job["stage"]: job for job in plan["jobs"] if job["kind"] == "stage"}
    for stage, job in pods.items():
        manifest = next(m for m in job["manifests"] if m["kind"] in ("Job", "PyTorchJob"))
        spec = (manifest["spec"]["template"]["spec"] if manifest["kind"] == "Job"
                else manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"])
        limits = spec["containers"][0].get("resources", {}).get("limits", {})
        if stage == "pretrain":
            assert limits["nvidia.com/gpu"] == "8" and spec["nodeSelector"] == {
                "node.kubernetes.io/instance-type": "p4de.24xlarge"}
            continue
        assert int(limits["cpu"]) <= 16 and int(limits["memory"].removesuffix("Gi")) <= 57, (stage, limits)
        processes = job["processes"]
        assert processes <= int(limits["cpu"]), (stage, processes, limits)  # no 48 processes under 8 CPUs
    estimates = {s["stage"]: s for s in plan["estimates"]["stages"]}
    assert (estimates["pretrain"]["nodes"], estimates["pretrain"]["gpus_per_node"]) == (4, 8)
