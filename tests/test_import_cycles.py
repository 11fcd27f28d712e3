"""No two modules of agent_rl/, envs/, sandboxes/ or vcpo/ import each other, directly or around a circle,
counting imports inside functions (a lazy import still ties the two files together for a reader); and no two
packages either (agent_rl/engines/ and agent_rl/weights/, say), where a package is the folder its modules
sit in. Imports under `if TYPE_CHECKING:` are annotations only and are not counted, except between the modules
of one folder (a room), where a type-only import back up is a circle too."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agent_rl", "envs", "sandboxes", "vcpo")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def _imports(path: Path, modules: set[str], annotations: bool = False) -> set[str]:
    """The project modules `path` imports (at any depth), resolved to the deepest existing module; with
    `annotations`, those under `if TYPE_CHECKING:` too."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node) and not annotations:
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            for a in node.names:  # `from pkg import module` imports the module; `from pkg import name`, pkg
                found.add(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    out = set()
    for imp in found:
        parts = imp.split(".")
        for cut in range(len(parts), 0, -1):
            if ".".join(parts[:cut]) in modules:
                out.add(".".join(parts[:cut]))
                break
    out.discard(name)
    return out


def _graph(annotations: bool = False) -> dict[str, set[str]]:
    files = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    modules = {_module_name(p) for p in files}
    return {_module_name(p): _imports(p, modules, annotations) for p in files}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def test_the_cycle_finder_finds_a_planted_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_in_agent_rl_envs_sandboxes_vcpo():
    graph = _graph()
    assert "agent_rl.engines.api" in graph and "envs.datasets" in graph
    cycles = _cycles(graph)
    assert not cycles, (
        "modules that import each other (untie them: a lower module both use, or a parameter):\n"
        + "\n".join(" <-> ".join(c) for c in cycles)
    )


def _package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph with every module below the top level folded into its folder (agent_rl.engines.pool
    -> agent_rl.engines; agent_rl.engines.embedded.engine -> agent_rl.engines.embedded). Modules directly
    under a top-level package (agent_rl.hosts) stay nodes of their own: the module rule covers them. A
    package importing its own subpackage (a facade choosing a backend) is not counted."""

    def node(module: str) -> str:
        parts = module.split(".")
        if (ROOT.joinpath(*parts)).is_dir() or len(parts) <= 2:
            return module
        return ".".join(parts[:-1])

    out: dict[str, set[str]] = {}
    for module, deps in graph.items():
        a = node(module)
        out.setdefault(a, set()).update(b for d in deps if (b := node(d)) != a and not b.startswith(a + "."))
    return out


def test_the_package_graph_folds_modules_into_their_folders():
    graph = {"agent_rl.engines.pool": {"agent_rl.weights.group"}, "agent_rl.weights.group": set()}
    graph |= {"agent_rl.weights.broadcast": {"agent_rl.engines.api"}, "agent_rl.engines.api": set()}
    assert _cycles(_package_graph(graph)) == [["agent_rl.engines", "agent_rl.weights"]]
    assert _cycles(_package_graph({"agent_rl.hosts": {"agent_rl.engines.api"}})) == []


def test_no_two_packages_import_each_other():
    """A folder is one layer: if engines/ imports weights/, weights/ must not import engines/ (wire types
    both use go below both)."""
    cycles = _cycles(_package_graph(_graph()))
    assert not cycles, (
        "packages that import each other (move what both use below both, or the code that uses both above):\n"
        + "\n".join(" <-> ".join(c) for c in cycles)
    )


def _room(module: str) -> str:
    """The folder (room) a module sits in; a package's __init__ sits in its own."""
    return module if ROOT.joinpath(*module.split(".")).is_dir() else module.rpartition(".")[0]


def _room_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph with only the imports between modules of one folder."""
    return {m: {d for d in deps if _room(d) == _room(m)} for m, deps in graph.items()}


# Circles inside a room not yet broken: none since issue 58, item 4 (engines/embedded's shared types moved down
# to shapes.py and fused.py; the gateway's to session.py). Nothing may join.
KNOWN_ROOM_CIRCLES: tuple[set[str], ...] = ()


def test_the_room_graph_keeps_the_imports_within_one_folder():
    graph = {"agent_rl.gateway.routes": {"agent_rl.gateway.session", "agent_rl.openai.chat"}}
    graph |= {"agent_rl.gateway.session": {"agent_rl.engines.api"}, "agent_rl.openai.chat": set()}
    assert _room_graph(graph) == {
        "agent_rl.gateway.routes": {"agent_rl.gateway.session"},
        "agent_rl.gateway.session": set(),
        "agent_rl.openai.chat": set(),
    }
    assert _room("agent_rl.gateway") == "agent_rl.gateway"  # the package's __init__
    plain, typed = _graph(), _graph(annotations=True)
    assert any(typed[m] - plain[m] for m in plain), "imports under `if TYPE_CHECKING:` were not read"


def test_no_import_circles_inside_a_room_even_for_annotations():
    """Inside one folder, a module that another imports never imports it back, not even under
    `if TYPE_CHECKING:` for an annotation: the two files could not be read or changed apart. What both name goes
    down a floor, into a module both import (gateway/session.py holds the `Session` that server.py opens and
    routes.py answers for, and the `SessionHost` face of the gateway that routes.py needs)."""
    cycles = [
        c
        for c in _cycles(_room_graph(_graph(annotations=True)))
        if not any(set(c) <= k for k in KNOWN_ROOM_CIRCLES)
    ]
    assert not cycles, (
        "modules of one folder that import each other, counting `if TYPE_CHECKING:` imports (move the types "
        "both use into a module below both):\n" + "\n".join(" <-> ".join(c) for c in cycles)
    )


def test_the_core_packages_never_import_recipes_benchmarks_or_examples():
    """Imports point down: the framework is used by studies, benchmarks and examples, never the reverse."""
    outside = ("recipes", "benchmarks", "examples")
    files = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    modules = {_module_name(p) for p in files} | set(outside)
    bad = sorted(
        f"{_module_name(p)} -> {m}"
        for p in files
        for m in _imports(p, modules | {f"{o}.x" for o in outside})
        if m.split(".")[0] in outside
    )
    assert not bad, "core modules importing studies/benchmarks/examples:\n" + "\n".join(bad)


def test_light_modules_load_neither_torch_nor_aiohttp():
    import subprocess
    import sys

    code = (
        "import sys, agent_rl.engines.api, vcpo.monitor, agent_rl.config, agent_rl.types; "
        "print(sorted(m for m in ('torch', 'aiohttp') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"
