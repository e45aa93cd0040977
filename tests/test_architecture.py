"""The house rules that a reader of the code relies on, checked over the source tree: the layers
point one way (``lint-imports`` checks the contracts in pyproject.toml; here, no cycle at all
among shoal's modules), imports of shoal modules sit at the top of a module (only the CLI
imports lazily, for its start-up time), nothing below the CLI prints, and modules and
functions stay small enough to read."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "shoal"
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
MAX_PARAMETERS = 8


def _modules() -> dict[str, ast.Module]:
    out = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC.parent).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        out[name] = ast.parse(path.read_text(), filename=str(path))
    return out


MODULES = _modules()


def _in_cli(name: str) -> bool:
    return name == "shoal.cli" or name.startswith(("shoal.cli.", "shoal.__main__"))


def _imported(name: str, node: ast.ImportFrom | ast.Import) -> list[str]:
    """The shoal modules an import statement names (``from a import b`` names ``a.b`` when
    that is a module, else ``a``)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "shoal"]
    if node.level:
        base = name.split(".")[: -node.level] if not name.endswith("__init__") else name.split(".")
        mod = ".".join(base + ([node.module] if node.module else []))
    else:
        mod = node.module or ""
    if mod.split(".")[0] != "shoal":
        return []
    subs = [f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in MODULES]
    return subs or [mod]


def _functions(tree: ast.Module):
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def _compiled(fn: ast.FunctionDef) -> bool:
    """A numba kernel (``shoal.jit.compiled``): flat arrays in, by design."""
    return any(ast.unparse(d.func if isinstance(d, ast.Call) else d) == "compiled"
               for d in fn.decorator_list)


def test_no_import_cycle_among_shoal_modules():
    graph = nx.DiGraph()
    for name, tree in MODULES.items():
        graph.add_node(name)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for target in _imported(name, node):
                    # a package's __init__ is run before its modules: ``a.b`` imports ``a``
                    if target in MODULES and not name.startswith(target + "."):
                        graph.add_edge(name, target)
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, f"import cycles: {cycles[:5]}"


def test_imports_of_shoal_modules_sit_at_module_top_outside_the_cli():
    inside = []
    for name, tree in MODULES.items():
        if _in_cli(name):
            continue
        for fn in _functions(tree):
            for node in ast.walk(fn):
                if isinstance(node, ast.Import | ast.ImportFrom) and _imported(name, node):
                    inside.append(f"{name}:{node.lineno}")
    assert not inside, f"function-level imports of shoal modules: {inside}"


# The worker process a launcher starts (torchrun) reports each step on its stdout: that stream
# is its output, as a command's is.
PROCESS_MAINS = {"shoal.runtime.entry"}


def test_nothing_below_the_cli_prints():
    prints = []
    for name, tree in MODULES.items():
        if _in_cli(name) or name in PROCESS_MAINS:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id == "print":
                prints.append(f"{name}:{node.lineno}")
    assert not prints, f"print below the CLI: {prints}"


def test_modules_stay_under_600_lines():
    long = {str(p.relative_to(SRC)): n for p in SRC.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def _cli_command(fn: ast.FunctionDef) -> bool:
    """A command of the CLI: every parameter is one of its options or arguments."""
    args = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
    return bool(args) and all(a.annotation is not None and ast.unparse(a.annotation).startswith(
        ("Annotated[", "typer.")) for a in args)


@pytest.mark.parametrize("limit", ["lines", "parameters"])
def test_functions_stay_short_with_few_parameters(limit):
    over = []
    for name, tree in MODULES.items():
        for fn in _functions(tree):
            if _compiled(fn):
                continue
            if limit == "lines":
                n = fn.end_lineno - fn.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    over.append(f"{name}.{fn.name} ({n} lines)")
            else:
                a = fn.args
                n = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) \
                    + bool(a.vararg) + bool(a.kwarg)
                if a.args and a.args[0].arg in ("self", "cls"):
                    n -= 1
                if n > MAX_PARAMETERS and not (_in_cli(name) and _cli_command(fn)):
                    over.append(f"{name}.{fn.name} ({n} parameters)")
    assert not over, f"over the limit: {over}"
