"""The kvtier package's import graph has no cycle.

Every module of python/kvtier is parsed with `ast` (nothing is imported) and
each import of a kvtier module becomes an edge, wherever it stands: at
module level, inside a function, or under `if TYPE_CHECKING:`. A cycle
fails the test naming its modules and the lines of its imports: a cycle
hidden behind a function-level import still ties the modules together
(neither can be understood, moved or tested without the other), and one
moved to module level breaks at import time.

Edges: `import kvtier.a.b` and `from kvtier.a import b` (b a module) go to
kvtier.a.b; `from .a import name` goes to the module `name` is in; the
implicit import of a module's parent packages is left out (Python runs
every parent's __init__ first, which is no cycle), but an import of a
package itself (`from kvtier import Client`, `from . import name` for a
name of __init__) is an edge to its __init__.

Thread-safety: pytest runs these tests in one thread.
"""

import ast
import os
import textwrap

PY_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def package_modules(root: str, package: str = "kvtier") -> dict[str, str]:
    """{dotted module name: file} of every .py file under root/package
    (a package's __init__.py is the package's own name)."""
    out = {}
    base = os.path.join(root, package)
    for folder, dirs, files in os.walk(base):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        rel = os.path.relpath(folder, root)
        prefix = rel.replace(os.sep, ".")
        for f in sorted(files):
            if not f.endswith(".py"):
                continue
            name = prefix if f == "__init__.py" else f"{prefix}.{f[:-3]}"
            out[name] = os.path.join(folder, f)
    return out


def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    """The absolute name of `from <level dots><target> import ...` in `module`."""
    if level == 0:
        return target or ""
    parts = module.split(".")
    if not is_package:
        parts = parts[:-1]
    if level > 1:
        parts = parts[:len(parts) - (level - 1)]
    return ".".join(parts + ([target] if target else []))


def import_edges(modules: dict[str, str], package: str = "kvtier"):
    """{module: {imported module: [(line, "module level" or "in a
    function"), ...]}} over the modules of package_modules."""
    edges: dict[str, dict[str, list]] = {m: {} for m in modules}

    def add(src: str, dst: str, line: int, where: str) -> None:
        if dst in modules and dst != src:  # src: `from . import x` in an __init__
            seen = edges[src].setdefault(dst, [])
            if (line, where) not in seen:  # `from .a import x, y`: one import
                seen.append((line, where))

    for name, path in modules.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
        is_package = os.path.basename(path) == "__init__.py"
        functions = [n for n in ast.walk(tree)
                     if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]
        nested = {id(n) for fn in functions for n in ast.walk(fn) if n is not fn}
        for node in ast.walk(tree):
            where = "in a function" if id(node) in nested else "module level"
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == package or alias.name.startswith(package + "."):
                        add(name, alias.name, node.lineno, where)
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(name, is_package, node.level, node.module)
                if base != package and not base.startswith(package + "."):
                    continue
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    add(name, sub if sub in modules else base, node.lineno, where)
    return edges


def find_cycles(edges) -> list[list[str]]:
    """Cycles of the graph, each as [a, b, ..., a]: at least one through
    every strongly connected part of more than one module."""
    cycles, seen = [], set()
    state: dict[str, int] = {}  # 1: on the DFS stack, 2: done
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for dst in sorted(edges[m]):
            if state.get(dst) == 1:
                cycle = stack[stack.index(dst):] + [dst]
                key = frozenset(cycle)
                if key not in seen:
                    seen.add(key)
                    cycles.append(cycle)
            elif dst not in state:
                visit(dst)
        stack.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m)
    return cycles


def describe(cycle: list[str], edges, modules) -> str:
    """'a -> b -> a (a.py:3, module level; b.py:9, in a function)': the
    cycle and the file and line of each of its imports."""
    lines = []
    for src, dst in zip(cycle, cycle[1:]):
        lines += [f"{os.path.basename(modules[src])}:{line}, {kind}"
                  for line, kind in edges[src][dst]]
    return " -> ".join(cycle) + " (" + "; ".join(lines) + ")"


def test_the_kvtier_package_imports_no_cycle():
    modules = package_modules(PY_ROOT)
    edges = import_edges(modules)
    cycles = find_cycles(edges)
    assert not cycles, "import cycles in python/kvtier:\n" + "\n".join(
        describe(c, edges, modules) for c in cycles)


def test_the_graph_sees_the_package():
    """The walk finds the subpackages and both kinds of import (a graph
    that missed them would pass the test above for nothing)."""
    modules = package_modules(PY_ROOT)
    assert {"kvtier", "kvtier.client", "kvtier.vllm", "kvtier.vllm.worker"} <= set(modules)
    edges = import_edges(modules)
    assert "kvtier._lib" in edges["kvtier.client"]
    # kvtier.library_version imports _lib in its body.
    assert ("in a function" in
            {kind for _, kind in edges["kvtier"]["kvtier._lib"]})
    assert "kvtier.client" in edges["kvtier.vllm.link"]  # from ..client


def test_a_cycle_through_a_function_level_import_is_named(tmp_path):
    """A package made for the test: a -> b at module level, b -> a inside a
    function, c -> a through `import pkg.a`; the cycle is a <-> b alone."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text(textwrap.dedent("""\
        def f():
            from ..a import thing
            return thing
        """))
    (pkg / "c.py").write_text("import pkg.a\n")
    modules = package_modules(str(tmp_path), "pkg")
    edges = import_edges(modules, "pkg")
    assert edges["pkg.a"] == {"pkg.sub.b": [(1, "module level")]}
    assert edges["pkg.sub.b"] == {"pkg.a": [(2, "in a function")]}
    assert edges["pkg.c"] == {"pkg.a": [(1, "module level")]}
    cycles = find_cycles(edges)
    assert cycles == [["pkg.a", "pkg.sub.b", "pkg.a"]]
    assert describe(cycles[0], edges, modules) == (
        "pkg.a -> pkg.sub.b -> pkg.a (a.py:1, module level; b.py:2, in a function)")
