"""The package's import order (docs/ARCHITECTURE.md): wings import only wings below them, and nothing circles.

Every `import` counts, also one inside a function: a lazy import is still a dependency, and a circle through it
is still a circle. The checker is tried on small packages made here too, so a broken checker cannot pass.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

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
    return [f"{m or '(package)'} ({wing_of(m)}) imports {t} ({wing_of(t)})" for m, targets in sorted(graph.items())
            for t in sorted(targets) if WINGS.index(wing_of(t)) > WINGS.index(wing_of(m))]


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
        imports = [n for n in ast.walk(ast.parse(init.read_text(encoding="utf-8")))
                   if isinstance(n, (ast.Import, ast.ImportFrom))]
        assert imports == [], f"{init.relative_to(PACKAGE.parent)} imports something"


def test_stage_programs_import_nothing_of_the_orchestrator():
    """They run inside jobs, where only stages/ is shipped (docs/CONVENTIONS.md)."""
    for path in STAGE_PROGRAMS.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n.split(".")[0] == "bcp_pipeline" for n in names), f"{path.name} imports {names}"


def test_backends_print_nothing():
    """Backends report through return values and errors; what reaches the terminal is the CLI's to say."""
    for path in (PACKAGE / "backends").glob("*.py"):
        calls = [n for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                 if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "print"]
        assert calls == [], f"{path.name} calls print() on line {calls[0].lineno}" if calls else ""


# -- the checker, on packages made here ------------------------------------------------------------------------
def make_package(root: Path, files: dict[str, str]) -> Path:
    package = root / "bcp_pipeline"
    for name, text in {"__init__.py": "", **files}.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return package


def test_checker_finds_a_circle_through_a_lazy_import(tmp_path):
    package = make_package(tmp_path, {
        "engine/__init__.py": "",
        "engine/a.py": "from .b import thing\n",
        "engine/b.py": "def thing():\n    from . import a\n    from bcp_pipeline.engine import c\n",
        "engine/c.py": "import bcp_pipeline.engine.b\n",
    })
    assert circles(module_graph(package)) == [["engine.a", "engine.b", "engine.c"]]


@pytest.mark.parametrize("source, expected", [
    ("from ..cli.main import x\n", ["engine.runs (engine) imports cli.main (cli)"]),
    ("from ..errors import x\nfrom ..config.pipelines import y\n", []),
])
def test_checker_finds_a_lower_wing_importing_a_higher_one(tmp_path, source, expected):
    package = make_package(tmp_path, {"errors.py": "", "config/__init__.py": "", "config/pipelines.py": "",
                                      "cli/__init__.py": "", "cli/main.py": "", "engine/__init__.py": "",
                                      "engine/runs.py": source})
    assert wrong_way(module_graph(package)) == expected


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
