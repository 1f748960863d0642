"""Imports go one way: no import cycles in factory/, scripts/ or notes/probes/ (each module can be
read knowing only what it imports), and each layer of factory/ imports only the layers below it (LAYERS).

The graph is read from the source with ``ast`` (nothing is imported).  An edge is every import of a
module of this project, wherever it stands: at the top, inside a function (a lazy import breaks the
cycle for the interpreter, not for a reader), under ``TYPE_CHECKING``, or as
``importlib.import_module("literal")``.  Imports built at run time (an f-string) are not followed.
An import points at the module it names: ``from .bundle import X`` at ``bundle.py``, ``from . import
gemm`` at ``gemm.py``, ``from factory.runtime import Bundle`` at the package's ``__init__.py``; the
parent packages that Python also initialises are not edges (every submodule would otherwise form a
cycle with an ``__init__`` that imports it).  Scripts resolve a plain name first in their own
folder (``sys.path[0]``), then from the repository root (where they put ``factory``).
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("factory", "scripts", "notes/probes")


def modules(root: Path, folders=FOLDERS) -> dict[str, Path]:
    """Dotted name (from ``root``) -> file, for every .py file under ``folders``."""
    out = {}
    for folder in folders:
        for p in sorted((root / folder).rglob("*.py")):
            parts = p.relative_to(root).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _imports(tree: ast.AST):
    """(level, module, names) for every import statement and literal importlib.import_module()."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield 0, a.name, ()
        elif isinstance(node, ast.ImportFrom):
            yield node.level, node.module or "", tuple(a.name for a in node.names)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            name = node.args[0].value
            level = len(name) - len(name.lstrip("."))
            yield level, name[level:], ()


def import_graph(root: Path, folders=FOLDERS) -> dict[str, set[str]]:
    """Module -> the project modules it imports (see the module docstring for what counts)."""
    mods = modules(root, folders)
    graph = {}
    for me, path in mods.items():
        is_pkg = path.name == "__init__.py"
        package = me.split(".") if is_pkg else me.split(".")[:-1]
        # Where a plain name is looked up: a script's own folder first, then the root.
        prefixes = [] if me.startswith("factory") else [".".join(package)]
        edges = set()
        for level, module, names in _imports(ast.parse(path.read_text(), str(path))):
            if level:
                base = package[:len(package) - (level - 1)] + (module.split(".") if module else [])
                bases = [".".join(base)]
            else:
                bases = [f"{p}.{module}" for p in prefixes] + [module]
            for base in bases:
                subs = [f"{base}.{n}" for n in names if f"{base}.{n}" in mods]
                if subs or base in mods:
                    edges.update(subs or [base])
                    break
        edges.discard(me)
        graph[me] = edges
    return graph


def tangles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan): within each, every
    module reaches every other.  Sorted."""
    index, low, stack, on, comps = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(sorted(c) for c in comps)


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (modules, the first repeated at the end) per tangle: the shortest way from its
    first module back to itself."""
    cycles = []
    for comp in tangles(graph):
        start = comp[0]
        paths, seen = [[start]], {start}
        while paths:
            path = paths.pop(0)
            nxt = sorted(w for w in graph[path[-1]] if w in comp)
            if start in nxt:
                cycles.append(path + [start])
                break
            for w in nxt:
                if w not in seen:
                    seen.add(w)
                    paths.append(path + [w])
    return sorted(cycles)


def test_no_import_cycles_in_factory_scripts_or_probes():
    graph = import_graph(ROOT)
    assert len(graph) > 20 and {"factory.runtime.bundle", "scripts.bench", "notes.probes.probe_slowdown"} <= set(graph)
    mods = modules(ROOT)
    rel = lambda m: str(mods[m].relative_to(ROOT))  # noqa: E731
    report = [f"  {', '.join(map(rel, comp))}\n    e.g. {' -> '.join(map(rel, cycle))}"
              for comp, cycle in zip(tangles(graph), find_cycles(graph))]
    assert not report, "modules that import each other (none of them can be read alone):\n" + "\n".join(report)


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return tmp_path


def test_the_cycle_finder_catches_planted_cycles(tmp_path):
    """A lazy relative import closing a cycle in a package, and two scripts importing each other."""
    root = _tree(tmp_path, {
        "factory/__init__.py": "",
        "factory/pkg/__init__.py": "from .a import f\n",
        "factory/pkg/a.py": "from . import b\n\ndef f():\n    return b\n",
        "factory/pkg/b.py": "def g():\n    from .c import h\n    return h\n",
        "factory/pkg/c.py": "import factory.pkg.a\n",
        "factory/leaf.py": "import os\nfrom factory.pkg import f\n",
        "scripts/one.py": "import sys\nfrom two import x\n",
        "scripts/two.py": "x = 1\n\ndef main():\n    import one\n",
        "scripts/three.py": "from factory import leaf\nfrom one import x\n",
    })
    graph = import_graph(root)
    assert graph["factory.leaf"] == {"factory.pkg"}
    assert graph["scripts.three"] == {"factory.leaf", "scripts.one"}
    assert find_cycles(graph) == [["factory.pkg.a", "factory.pkg.b", "factory.pkg.c", "factory.pkg.a"],
                                  ["scripts.one", "scripts.two", "scripts.one"]]


def test_the_cycle_finder_passes_one_direction(tmp_path):
    """Submodules under a package __init__ that imports them, importlib with a literal name, a
    script importing a sibling and the package: no cycle."""
    root = _tree(tmp_path, {
        "factory/__init__.py": "",
        "factory/pkg/__init__.py": "from .a import f\n",
        "factory/pkg/a.py": "import importlib\n\ndef f():\n    return importlib.import_module('factory.pkg.b')\n",
        "factory/pkg/b.py": "from ..leaf import x\n",
        "factory/leaf.py": "x = 1\n",
        "scripts/tools/p.py": "from factory.pkg import f\nfrom q import y\n",
        "scripts/tools/q.py": "y = 2\n",
    })
    graph = import_graph(root)
    assert graph["factory.pkg.a"] == {"factory.pkg.b"}
    assert graph["factory.pkg.b"] == {"factory.leaf"}
    assert graph["scripts.tools.p"] == {"factory.pkg", "scripts.tools.q"}
    assert find_cycles(graph) == []


# The layers, lowest first: each prefix may import itself and the prefixes named with it, nothing
# else of the project (the runtime loads bundles without the DSL, the kernels, or the compiler;
# the compiler sees kernels only through the registry; verify and doctor stand above the compiler).
LAYERS = {
    "factory.atoms": (),
    "factory.abi": (),
    "factory.runtime": ("factory.abi", "factory.atoms.targets"),
    # Run records and proof labels, read by the build and verify (file checks: the runtime's).
    "factory.evidence": ("factory.runtime",),
    "factory.variant": ("factory.abi", "factory.atoms"),
    "factory.registry": ("factory.atoms", "factory.variant"),
    "factory.gemm": ("factory.abi", "factory.atoms", "factory.variant", "factory.registry"),
    "factory.attention": ("factory.abi", "factory.atoms", "factory.variant", "factory.registry", "factory.gemm"),
    "factory.elementwise": ("factory.abi", "factory.atoms", "factory.variant", "factory.registry"),
    "factory.compiler": ("factory.abi", "factory.atoms", "factory.evidence", "factory.variant", "factory.registry",
                         "factory.runtime"),
    "factory.verify": ("factory.atoms", "factory.compiler", "factory.evidence", "factory.runtime"),
    "factory.doctor": ("factory.atoms", "factory.runtime"),
}


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """``a -> b`` for every import of a layered module that its layer does not allow."""
    out = []
    for me, deps in sorted(graph.items()):
        layer = next((p for p in LAYERS if _under(me, p)), None)
        if layer is None:
            continue
        allowed = (layer, *LAYERS[layer])
        out += [f"{me} -> {d}" for d in sorted(deps) if d != "factory" and not any(_under(d, a) for a in allowed)]
    return out


def test_imports_go_one_way():
    graph = import_graph(ROOT)
    assert {"factory.compiler.builder", "factory.compiler.sass", "factory.verify"} <= set(graph)
    assert layer_violations(graph) == []


def test_the_layer_check_catches_an_upward_import(tmp_path):
    """The compiler importing verify, and the runtime importing the compiler, are both reported."""
    root = _tree(tmp_path, {
        "factory/__init__.py": "",
        "factory/verify.py": "from .compiler.sass import check\n",
        "factory/compiler/__init__.py": "",
        "factory/compiler/sass.py": "def check():\n    from ..verify import x\n",
        "factory/runtime/__init__.py": "",
        "factory/runtime/bundle.py": "from factory.compiler import sass\nfrom .errors import E\n",
        "factory/runtime/errors.py": "E = 1\n",
    })
    assert layer_violations(import_graph(root, ("factory",))) == [
        "factory.compiler.sass -> factory.verify", "factory.runtime.bundle -> factory.compiler.sass"]
