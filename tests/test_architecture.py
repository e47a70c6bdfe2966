"""The package's import order (docs/ARCHITECTURE.md): wings import only wings below them, and nothing circles.

Every `import` counts, also one inside a function: a lazy import is still a dependency, and a circle through it
is still a circle. The checker is tried on small packages made here too, so a broken checker cannot pass.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from bcp_pipeline.config.resources import BACKENDS

PACKAGE = Path(__file__).resolve().parents[1] / "bcp_pipeline"
# Lowest first. "ground" is the package's top-level modules (errors, atomic writes, processes, redaction).
WINGS = ["ground", "config", "backends", "engine", "report", "detach", "check", "cli"]
ENTRY_POINTS = {"__main__": "cli"}  # top-level modules that belong to a higher wing
STAGE_PROGRAMS = Path(__file__).resolve().parents[1] / "stages"


def module_graph(package: Path) -> dict[str, set[str]]:
    """Each module of `package` (dotted, relative to it) -> the modules of `package` it imports."""
    modules = {_dotted(package, path): path for path in package.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        here = name.split(".") if is_package and name else name.split(".")[:-1]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here[: len(here) - (node.level - 1)] if node.level > 1 else here
                    target = ".".join([*base, *([node.module] if node.module else [])])
                elif node.module and node.module.split(".")[0] == package.name:
                    target = node.module.partition(".")[2]
                else:
                    continue
                for alias in node.names:  # `from . import x` may name a submodule
                    candidate = f"{target}.{alias.name}" if target else alias.name
                    edges.add(candidate if candidate in modules else target)
            elif isinstance(node, ast.Import):
                edges |= {a.name.partition(".")[2] for a in node.names if a.name.split(".")[0] == package.name}
        graph[name] = {e for e in edges if e in modules and e != name}
    return graph


def _dotted(package: Path, path: Path) -> str:
    parts = list(path.relative_to(package).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def wing_of(module: str) -> str:
    head = module.split(".")[0]
    if "." in module or head in WINGS:
        return head
    return ENTRY_POINTS.get(head, "ground")


def wrong_way(graph: dict[str, set[str]]) -> list[str]:
    """Imports of a higher wing from a lower one."""
    return [
        f"{m or '(package)'} ({wing_of(m)}) imports {t} ({wing_of(t)})"
        for m, targets in sorted(graph.items())
        for t in sorted(targets)
        if WINGS.index(wing_of(t)) > WINGS.index(wing_of(m))
    ]


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


# -- the package itself -------------------------------------------------------------------------------------------
def test_bcp_pipeline_has_no_import_circle():
    assert circles(module_graph(PACKAGE)) == []


def test_every_wing_imports_only_wings_below_it():
    graph = module_graph(PACKAGE)
    assert {wing_of(m) for m in graph} <= set(WINGS), "a module outside the wings: add it to one (ARCHITECTURE.md)"
    assert wrong_way(graph) == []


def test_wing_packages_import_nothing_on_their_own():
    """An `__init__` that imports its modules makes every import of one of them load them all, and hides circles
    (each module importing a sibling goes through the package first): the wings' `__init__` files stay empty."""
    for init in PACKAGE.rglob("__init__.py"):
        imports = [
            n
            for n in ast.walk(ast.parse(init.read_text(encoding="utf-8")))
            if isinstance(n, (ast.Import, ast.ImportFrom))
        ]
        assert imports == [], f"{init.relative_to(PACKAGE.parent)} imports something"


def test_stage_programs_import_nothing_of_the_orchestrator():
    """They run inside jobs, where only stages/ is shipped (docs/CONVENTIONS.md): every module under stages/, in
    any folder."""
    programs = sorted(STAGE_PROGRAMS.rglob("*.py"))
    assert programs, "no stage program found: the walk is broken"
    for path in programs:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            assert not any(n.split(".")[0] == "bcp_pipeline" for n in names), f"{path.name} imports {names}"


def test_backends_print_nothing():
    """Backends report through return values and errors; what reaches the terminal is the CLI's to say (every
    module under backends/, its folders included)."""
    modules = sorted((PACKAGE / "backends").rglob("*.py"))
    assert any(path.parent.name == "bcp" for path in modules), "the walk misses the backend folders"
    for path in modules:
        calls = [
            n
            for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "print"
        ]
        assert calls == [], f"{path.relative_to(PACKAGE)} calls print() on line {calls[0].lineno}" if calls else ""


# -- backend folders --------------------------------------------------------------------------------------------
def backend_folders(package: Path) -> set[str]:
    """The backends of `package`: each folder of backends/ that has a backend.py."""
    return {path.parent.name for path in (package / "backends").glob("*/backend.py")}


def folder_of(module: str, folders: set[str]) -> str | None:
    """The backend whose folder holds `module` (`backends.bcp.render` -> bcp), None for any other module."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and parts[0] == "backends" and parts[1] in folders else None


def cross_backend_imports(graph: dict[str, set[str]], folders: set[str]) -> list[str]:
    """Imports of a backend folder by anything but its own modules, the registry and detach/ (BCP's by nature)."""
    found = []
    for module, targets in sorted(graph.items()):
        mine = folder_of(module, folders)
        for target in sorted(targets):
            theirs = folder_of(target, folders)
            allowed = module == "backends.registry" or (module.startswith("detach.") and theirs == "bcp")
            if theirs is not None and theirs != mine and not allowed:
                found.append(f"{module} imports {target} (the {theirs} backend's folder)")
            if mine is not None and target == "backends.registry":
                found.append(f"{module} imports the registry: a backend knows no other backend")
    return found


def test_a_backend_folder_is_imported_only_by_itself_the_registry_and_detach():
    graph = module_graph(PACKAGE)
    folders = backend_folders(PACKAGE)
    assert folders == {"local", "bcp", "slurm", "gridengine", "kubernetes", "lepton"}
    assert cross_backend_imports(graph, folders) == []


def test_every_backend_of_the_table_is_a_folder_the_registry_finds():
    from bcp_pipeline.backends.registry import backend_class

    assert set(BACKENDS) == backend_folders(PACKAGE)
    for name in BACKENDS:
        assert backend_class(name).name == name


NAMES = "|".join(BACKENDS)  # the table's, so a new backend is covered as soon as it has a row
BACKEND_NAME_WORD = re.compile(rf"\b({NAMES})\b")


def backend_name_lists(package: Path) -> list[str]:
    """Literals outside config/resources.py that spell out several backend names: a tuple, list, set or dict of
    them, or a text listing them (`bcp|slurm|...`). The names are written once, in config.resources.BACKENDS;
    everything else derives from it."""
    found = []
    for path in sorted(package.rglob("*.py")):
        if path.relative_to(package).as_posix() == "config/resources.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                names = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            elif isinstance(node, ast.Dict):
                names = [k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names = (
                    BACKEND_NAME_WORD.findall(node.value)
                    if re.search(rf"\b(?:{NAMES})\s*[|,/]\s*(?:{NAMES})\b", node.value)
                    else []
                )
            else:
                continue
            named = {name for name in names if BACKEND_NAME_WORD.fullmatch(name)}
            if len(named) >= 2:
                found.append(f"{path.relative_to(package)}:{node.lineno}: {sorted(named)}")
    return found


def test_the_backend_names_are_written_once():
    assert backend_name_lists(PACKAGE) == []


def backend_name_comparisons(package: Path, names: set[str]) -> list[str]:
    """Comparisons of a value with a backend's name anywhere outside the backend folders: `== "slurm"`,
    `!= "local"`, `"bcp" in ...`, `in ("bcp", "slurm")` (any literal tuple, list or set holding a name) and
    `case "kubernetes":`. What differs between backends is asked of them: their `Backend` class, their config
    section's hooks (config/sections/hooks.py). A backend's own folder may name itself."""
    folders = backend_folders(package)
    found = []
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package).parts
        if parts[0] == "backends" and len(parts) > 2 and parts[1] in folders:
            continue

        def named(node: ast.AST) -> bool:
            return isinstance(node, ast.Constant) and node.value in names

        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                for op, left, right in zip(node.ops, sides, sides[1:]):
                    if isinstance(op, (ast.In, ast.NotIn)):
                        literal = isinstance(right, (ast.Tuple, ast.List, ast.Set)) and any(map(named, right.elts))
                        hit = named(left) or literal
                    else:
                        hit = isinstance(op, (ast.Eq, ast.NotEq, ast.Is, ast.IsNot)) and (named(left) or named(right))
                    if hit:
                        found.append(f"{path.relative_to(package)}:{node.lineno}: {ast.unparse(node)}")
                        break
            elif isinstance(node, ast.MatchValue) and named(node.value):
                found.append(f"{path.relative_to(package)}:{node.lineno}: case {ast.unparse(node.value)}")
    return found


def test_nothing_outside_a_backends_folder_compares_a_backend_name():
    """ARCHITECTURE.md's "hooks instead of names": config/, report/, cli/, the engine ask a backend's class or its
    config section, so a new backend needs no edit there (docs/backends/adding-a-backend.md)."""
    assert backend_name_comparisons(PACKAGE, set(BACKENDS)) == []


# -- the checker, on packages made here ------------------------------------------------------------------------
def make_package(root: Path, files: dict[str, str]) -> Path:
    package = root / "bcp_pipeline"
    for name, text in {"__init__.py": "", **files}.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return package


def test_checker_finds_a_circle_through_a_lazy_import(tmp_path):
    package = make_package(
        tmp_path,
        {
            "engine/__init__.py": "",
            "engine/a.py": "from .b import thing\n",
            "engine/b.py": "def thing():\n    from . import a\n    from bcp_pipeline.engine import c\n",
            "engine/c.py": "import bcp_pipeline.engine.b\n",
        },
    )
    assert circles(module_graph(package)) == [["engine.a", "engine.b", "engine.c"]]


@pytest.mark.parametrize(
    "source, expected",
    [
        ("from ..cli.main import x\n", ["engine.runs (engine) imports cli.main (cli)"]),
        ("from ..errors import x\nfrom ..config.pipelines import y\n", []),
    ],
)
def test_checker_finds_a_lower_wing_importing_a_higher_one(tmp_path, source, expected):
    package = make_package(
        tmp_path,
        {
            "errors.py": "",
            "config/__init__.py": "",
            "config/pipelines.py": "",
            "cli/__init__.py": "",
            "cli/main.py": "",
            "engine/__init__.py": "",
            "engine/runs.py": source,
        },
    )
    assert wrong_way(module_graph(package)) == expected


@pytest.mark.parametrize(
    "module, source, expected",
    [
        (
            "backends/slurm/check.py",
            "from bcp_pipeline.backends.local.check import PROBE\n",
            ["backends.slurm.check imports backends.local.check (the local backend's folder)"],
        ),
        (
            "backends/shared/logs.py",
            "from ..bcp.states import STATE_MAP\n",
            ["backends.shared.logs imports backends.bcp.states (the bcp backend's folder)"],
        ),
        (
            "engine/poller.py",
            "def f():\n    from bcp_pipeline.backends.slurm import backend\n",
            ["engine.poller imports backends.slurm.backend (the slurm backend's folder)"],
        ),
        (
            "backends/slurm/check.py",
            "from bcp_pipeline.backends.registry import make_backend\n",
            ["backends.slurm.check imports the registry: a backend knows no other backend"],
        ),
        ("backends/slurm/check.py", "from ..shared.logs import x\nfrom .render import y\n", []),
        ("detach/jobs.py", "from bcp_pipeline.backends.bcp.states import status_of\n", []),
    ],
)
def test_checker_finds_a_planted_cross_backend_import(tmp_path, module, source, expected):
    files = {
        f"backends/{name}/{leaf}": ""
        for name in ("local", "bcp", "slurm")
        for leaf in ("__init__.py", "backend.py", "check.py", "states.py", "render.py")
    }
    files |= {
        "backends/__init__.py": "",
        "backends/registry.py": "",
        "backends/shared/__init__.py": "",
        "backends/shared/logs.py": "",
        "engine/__init__.py": "",
        "engine/poller.py": "",
        "detach/__init__.py": "",
        "detach/jobs.py": "",
        module: source,
    }
    package = make_package(tmp_path, files)
    graph = module_graph(package)
    assert cross_backend_imports(graph, backend_folders(package)) == expected


@pytest.mark.parametrize(
    "source, found",
    [
        ('BACKENDS = ("local", "bcp")\n', 1),
        ('HELP = "--backend bcp|slurm|local"\n', 1),
        ('X = {"bcp": 1, "slurm": 2}\n', 1),
        ('WHAT = "a BCP job on bcp"\nONE = ("bcp",)\n', 0),
    ],
)
def test_checker_finds_a_second_list_of_backend_names(tmp_path, source, found):
    package = make_package(
        tmp_path,
        {
            "engine/__init__.py": "",
            "engine/x.py": source,
            "config/__init__.py": "",
            "config/resources.py": 'B = ("local", "bcp")\n',
        },
    )
    assert len(backend_name_lists(package)) == found


@pytest.mark.parametrize(
    "module, source, found",
    [
        ("report/nodes.py", 'if backend == "slurm":\n    pass\n', ["report/nodes.py:1: backend == 'slurm'"]),
        ("config/nemo.py", 'x = "bcp" != kind\n', ["config/nemo.py:1: 'bcp' != kind"]),
        ("cli/plan.py", 'x = n > 1 and backend in ("bcp", "slurm")\n', ["cli/plan.py:1: backend in ('bcp', 'slurm')"]),
        (
            "engine/x.py",
            'x = backend not in {"local"}\ny = "kubernetes" in used\n',
            ["engine/x.py:1: backend not in {'local'}", "engine/x.py:2: 'kubernetes' in used"],
        ),
        (
            "backends/shared/logs.py",
            'match backend:\n    case "local" | "lepton":\n        pass\n',
            ["backends/shared/logs.py:2: case 'local'"],
        ),
        # Not comparisons of a name: a section read by its name, a job's kind, another word; and a backend's own folder.
        ("config/bridge.py", 'x = stage.bcp.image or options["bcp"]\nif kind == "driver":\n    x = ("bcp",)\n', []),
        ("backends/slurm/render.py", 'if backend == "slurm" or kind in ("local", "bcp"):\n    pass\n', []),
    ],
)
def test_checker_finds_a_planted_comparison_of_a_backend_name(tmp_path, module, source, found):
    files = {f"backends/{name}/{leaf}": "" for name in ("local", "slurm") for leaf in ("__init__.py", "backend.py")}
    files |= {"backends/__init__.py": "", "backends/shared/__init__.py": "", module: source}
    package = make_package(tmp_path, files)
    assert backend_name_comparisons(package, {"local", "bcp", "slurm", "kubernetes"}) == found


# -- what the detached driver imports before it has checked its image ---------------------------------------------
def top_level_imports(path: Path) -> list[str]:
    """Modules `path` imports when it is imported: not inside a function, not under `if TYPE_CHECKING`."""
    names: list[str] = []

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(getattr(node, "orelse", []))
            elif isinstance(node, ast.Import):
                names.extend(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                names.append("." * node.level + (node.module or ""))

    visit(ast.parse(path.read_text(encoding="utf-8")).body)
    return names


def test_the_driver_module_loads_with_the_standard_library_alone():
    """`python3 -m bcp_pipeline.detach.driver` must start in an image without PyYAML or ngcsdk, to say so in one
    BCPP-ERROR line (tests/detach: a driver without ngcsdk): everything it loads on import is checked here."""
    import sys

    seen, todo, third_party = set(), ["detach.driver"], []
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        path = PACKAGE / (module.replace(".", "/") + ".py")
        if not path.exists():
            path = PACKAGE / module.replace(".", "/") / "__init__.py"
        here = module.split(".")[:-1]
        parents = [".".join(module.split(".")[:i]) for i in range(1, len(module.split(".")))]
        todo += [p for p in parents if p]  # importing a.b.c runs a/__init__ and a/b/__init__ first
        for name in top_level_imports(path):
            if name.startswith("."):
                level = len(name) - len(name.lstrip("."))
                base = here[: len(here) - (level - 1)] if level > 1 else here
                todo.append(".".join([*base, *([name.lstrip(".")] if name.lstrip(".") else [])]) or "__init__")
            elif name.split(".")[0] == "bcp_pipeline":
                todo.append(name.partition(".")[2] or "__init__")
            elif name.split(".")[0] not in sys.stdlib_module_names and name != "__future__":
                third_party.append(f"{module} imports {name}")
    assert "backends.contract" in seen and "engine.state" in seen  # the walk follows the package's imports
    assert third_party == []


# "About 400" and "near 600" lines of the house's dense style: `ruff format` (CI checks it) spreads a long call or
# literal over a line an argument, which makes the same module about a quarter longer, so the limits are counted on
# formatted code.
MODULE_LINES = 500  # past it, look for the seam; a module over it stays whole only with a reason below
MODULE_LINES_MAX = 750  # past this a module does two jobs, whatever the reason: split it along its seam
# Modules over MODULE_LINES, each with why it is one module. A hard cap at 400 split modules by line count, not by
# seam (commit c1f1379's 20- and 28-line modules, merged back); this list is the review of each one instead.
LONG_MODULES = {
    "bcp_pipeline/backends/kubernetes/render.py": "one pure renderer: a stage's manifests and the pod command "
    "wrappers they embed (time limit, rank lines, Master last)",
    "stages/sample.py": "the demo's offline data set, train and held-out shards from one generator (a split would "
    "change the data stages' output digests, so it waits for a release that changes them anyway)",
    "bcp_pipeline/report/estimates.py": "plan's cost model, one estimate a stage kind (data, training, export, "
    "evaluate); the export's and the held-out split's share belong beside their stages' config next",
}


def module_lines() -> dict[str, int]:
    root = Path(__file__).resolve().parents[1]
    return {
        str(path.relative_to(root)): len(path.read_text().splitlines())
        for folder in ("bcp_pipeline", "stages")
        for path in sorted((root / folder).rglob("*.py"))
    }


def test_no_module_is_over_about_500_formatted_lines_without_a_reason_nor_over_750():
    lines = module_lines()
    assert {name: n for name, n in lines.items() if n > MODULE_LINES_MAX} == {}
    over = {name: n for name, n in lines.items() if n > MODULE_LINES}
    assert sorted(over) == sorted(LONG_MODULES), (
        f"modules over {MODULE_LINES} lines: {over}; list each in LONG_MODULES with why it is one module (or split it "
        f"at its seam), and drop an entry whose module is back under {MODULE_LINES}"
    )


SHELL_PROGRAM_CHARS = 300  # a shell program this long is a `.sh` template beside its renderer (shellcheck reads it)
SHELL_MARKS = [
    re.compile(mark)
    for mark in (r";\s*then\b", r";\s*do\b", r"\bfi\b", r"\bdone\b", r"\$\(", r"\$\{", r">&2", r"\bexit\b")
]


def shell_programs(source: str) -> list[int]:
    """The lines where `source` assigns a string (an f-string's source counted whole) of SHELL_PROGRAM_CHARS or more
    that reads as shell: three of SHELL_MARKS (messages and prose have one at most)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
            continue
        value = node.value
        text = (
            value.value
            if isinstance(value, ast.Constant)
            else ast.unparse(value)
            if isinstance(value, ast.JoinedStr)
            else None
        )
        if (
            isinstance(text, str)
            and len(text) >= SHELL_PROGRAM_CHARS
            and sum(bool(mark.search(text)) for mark in SHELL_MARKS) >= 3
        ):
            found.append(node.lineno)
    return found


def test_job_scripts_are_sh_templates_not_python_strings():
    """backends/shared/templates.py: shellcheck cannot read a shell program held in a Python string."""
    root = Path(__file__).resolve().parents[1]
    found = {
        str(path.relative_to(root)): lines
        for path in sorted((root / "bcp_pipeline").rglob("*.py"))
        if (lines := shell_programs(path.read_text()))
    }
    assert found == {}


def test_checker_finds_a_shell_program_in_a_python_string():
    program = "; ".join(['if [ -n "$X" ]; then echo "$(date) $X" >&2; fi'] * 7)
    message = "bcp-pipeline: " + "the stage's time limit ran out, so the job was stopped; " * 6
    assert shell_programs(f"A = 1\nSCRIPT = {program!r}\ndef f(x):\n    s = f'{program} {{x}}'\n") == [2, 4]
    assert shell_programs(f"MESSAGE = {message!r}\nSHORT = 'if x; then exit 1; fi'\n") == []


def test_the_architecture_pages_table_cells_stay_short():
    """A newcomer reads docs/ARCHITECTURE.md in five minutes: no table cell over 400 characters."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "ARCHITECTURE.md").read_text()
    cells = [cell.strip() for line in page.splitlines() if line.startswith("|") for cell in line.split("|")]
    assert [cell[:60] for cell in cells if len(cell) > 400] == []
