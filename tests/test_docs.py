"""The README and docs/: every page is reachable from the README, every link lands on a file (and heading) that
exists, and the README stays a front page (under 300 lines) that starts with its two commands. One owner per
fact: every quoted repository path exists, no long sentence is copied between pages, dated figures live in
docs/performance.md and docs/testing.md, and CHANGELOG.md's top version is pyproject.toml's."""

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
    first_block = lines[lines.index("```bash") + 1 : lines.index("```")]
    assert [line.split("#")[0].strip() for line in first_block] == [
        "scripts/setup && .venv/bin/bcp-pipeline run demo",
        "scripts/setup --test && .venv/bin/python -m pytest",
    ]


def test_the_checker_finds_a_broken_link_and_a_missing_heading(tmp_path):
    page = tmp_path / "a.md"
    (tmp_path / "b.md").write_text("# Title\n\n## The `plan` verb\n")
    page.write_text(
        "[ok](b.md#the-plan-verb) [gone](c.md) [no heading](b.md#nope) [web](https://x.org/y)\n"
        "```\n[in code](d.md)\n```\n"
    )
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
        spec = (
            manifest["spec"]["template"]["spec"]
            if manifest["kind"] == "Job"
            else manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
        )
        limits = spec["containers"][0].get("resources", {}).get("limits", {})
        if stage == "pretrain":
            assert limits["nvidia.com/gpu"] == "8" and spec["nodeSelector"] == {
                "node.kubernetes.io/instance-type": "p4de.24xlarge"
            }
            continue
        assert int(limits["cpu"]) <= 16 and int(limits["memory"].removesuffix("Gi")) <= 57, (stage, limits)
        processes = job["processes"]
        assert processes <= int(limits["cpu"]), (stage, processes, limits)  # no 48 processes under 8 CPUs
    estimates = {s["stage"]: s for s in plan["estimates"]["stages"]}
    assert (estimates["pretrain"]["nodes"], estimates["pretrain"]["gpus_per_node"]) == (4, 8)


# ---------------------------------------------------------------------------------------------------------------
# One owner per fact: quoted paths exist, no long sentence is copied between pages, dates only where figures live
# ---------------------------------------------------------------------------------------------------------------

PACKAGE = REPO / "bcp_pipeline"
# Where a quoted path may be relative to: the repository, the package (`config/model.py`), its backends
# (`shared/batch.py`). A path whose first folder is none of these roots' folders is another project's (NeMo's,
# Megatron's) or one a run makes (`.manifest/`), and is not checked.
ROOTS = (REPO, PACKAGE, PACKAGE / "backends")
QUOTED = re.compile(r"`([^`\s]+)`")
EXTENSION = re.compile(r"\.(py|md|sh|yaml|yml|toml|txt|json|go|j2|cfg|ini)$")
PLACEHOLDER = re.compile(r"\b(NAME|STAGE|RUN|RANK|WORLD|RESULTS|ID|X)\b")
SENTENCE_WORDS = 12
SENTENCE = re.compile(r"(?<=[.!?:;])\s+(?=[A-Z`*(\[])")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
DATED_PAGES = ("docs/performance.md", "docs/testing.md", "CHANGELOG.md")
# Dated measurements still on the page they describe (the set-up's disk and time, the tokenizer engines' table, the
# Kubernetes build and test times, an estimate's source): each is to move to performance.md or testing.md.
NOT_YET_MOVED = {
    "docs/install.md",
    "docs/dependencies.md",
    "docs/backends/kubernetes.md",
    "docs/commands.md",
    "docs/pretraining.md",
    "docs/estimates-and-report.md",
}


def quoted_paths(text: str, roots: tuple[Path, ...] = ROOTS) -> list[str]:
    """The backticked tokens that look like paths of this repository: a / and a file extension, or a folder of one
    of `roots` first; or any path under a top folder of the repository (`benchmarks/`, `tests/fakes/ngc`)."""
    folders = {child.name for root in roots if root.is_dir() for child in root.iterdir() if child.is_dir()}
    top = {child.name for child in roots[0].iterdir() if child.is_dir()}
    found = []
    for token in QUOTED.findall(FENCE.sub("", text)):
        token = token.rstrip(".,:;)").split("::")[0].split("#")[0]
        if (
            "/" not in token
            or any(ch in token for ch in "*{}$<>=|@")
            or PLACEHOLDER.search(token)
            or token.startswith(("/", "~", "http", "-", "."))
        ):
            continue  # a glob, a placeholder, an absolute path, a command-line token or a file a run makes
        first = token.split("/")[0]
        if (EXTENSION.search(token) and first in folders) or first in top:
            found.append(token)
    return found


def missing_paths(page: Path, root: Path = REPO) -> list[str]:
    """The quoted repository paths of `page` that exist under none of the roots (nor beside the page)."""
    roots = (root, root / "bcp_pipeline", root / "bcp_pipeline" / "backends")
    return [
        f"{page.relative_to(root)}: `{token}`"
        for token in quoted_paths(page.read_text(encoding="utf-8"), roots)
        if not any((base / token).exists() for base in (*roots, page.parent))
    ]


def sentences(page: Path) -> set[str]:
    """The page's prose sentences of SENTENCE_WORDS words or more, whitespace normalised (no code, no tables)."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    prose = " ".join(line for line in text.splitlines() if not line.lstrip().startswith(("|", "#", "    ")))
    parts = (" ".join(part.split()) for part in SENTENCE.split(prose))
    return {part for part in parts if len(part.split()) >= SENTENCE_WORDS}


def copied_sentences(paths: list[Path], root: Path = REPO) -> list[str]:
    seen: dict[str, Path] = {}
    copies = []
    for page in paths:
        for sentence in sorted(sentences(page)):
            if sentence in seen and seen[sentence] != page:
                copies.append(f"{seen[sentence].relative_to(root)} and {page.relative_to(root)}: {sentence[:100]}")
            seen.setdefault(sentence, page)
    return copies


def markdown_pages() -> list[Path]:
    return [
        *pages(),
        *(REPO / name for name in ("CONTRIBUTING.md", "CHANGELOG.md")),
        REPO / "scripts" / "README.md",
        REPO / "tests" / "fakes" / "README.md",
    ]


def test_every_quoted_repository_path_exists():
    """CHANGELOG.md aside: history names the paths things had."""
    current = [page for page in markdown_pages() if page.name != "CHANGELOG.md"]
    assert [problem for page in current for problem in missing_paths(page)] == []


def test_no_long_sentence_is_copied_between_pages():
    """A fact has one page; another page links to it (a copy goes stale on its own)."""
    assert copied_sentences(markdown_pages()) == []


def dated_pages() -> set[str]:
    """The pages with a date outside their code blocks (a sample output's own timestamp is not a figure)."""
    return {
        str(page.relative_to(REPO))
        for page in markdown_pages()
        if DATE.search(FENCE.sub("", page.read_text(encoding="utf-8")))
    }


def test_dated_figures_live_only_in_performance_and_testing():
    """A dated measurement belongs to docs/performance.md (times of the tests to docs/testing.md); others link. The
    pages of NOT_YET_MOVED still hold some of their own: the list may only shrink (an entry with no date fails)."""
    assert dated_pages() - set(DATED_PAGES) == NOT_YET_MOVED


def test_the_checkers_find_a_missing_path_and_a_copied_sentence(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "stages").mkdir()
    (tmp_path / "stages" / "real.py").write_text("")
    long = "This sentence has well over twelve words in it so that the checker counts it."
    one, two = tmp_path / "docs" / "one.md", tmp_path / "docs" / "two.md"
    one.write_text(
        f"See `stages/real.py`, `stages/gone.py`, `docs/two.md`, `stages/gone/`, `megatron/core/x.py` "
        f"(another project's), `stages/*.py`, `docs/NAME.md`. {long}\n"
    )
    two.write_text(f"Intro. {long} Short one.\n")
    assert missing_paths(one, tmp_path) == ["docs/one.md: `stages/gone.py`", "docs/one.md: `stages/gone/`"]
    assert copied_sentences([one, two], tmp_path) == [f"docs/one.md and docs/two.md: {long[:100]}"]


def test_the_changelog_top_version_is_the_package_version():
    import tomllib

    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    top = re.search(r"^## \[(\d+\.\d+\.\d+)\]", (REPO / "CHANGELOG.md").read_text(encoding="utf-8"), re.M)
    assert top is not None, "CHANGELOG.md has no `## [X.Y.Z]` heading"
    assert top.group(1) == version
