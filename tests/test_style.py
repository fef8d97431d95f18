"""The code's shape rules, checked on every run: short functions with few parameters,
and no import cycle between the modules of nanobert/."""
import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "nanobert"
MAX_LINES, MAX_PARAMS = 60, 8


def functions():
    """(module file, function node) of every def in nanobert/, nested ones included."""
    for path in sorted(PACKAGE.glob("*.py")):
        tree = ast.parse(path.read_text("utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield path, node


def n_params(fn) -> int:
    """Parameters a caller can pass (self/cls and *args/**kwargs do not count)."""
    a = fn.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
    return len([n for n in names if n not in ("self", "cls")])


def test_no_long_functions_or_long_parameter_lists():
    too_long = [f"{p.name}:{fn.lineno} {fn.name} ({fn.end_lineno - fn.lineno + 1} lines)"
                for p, fn in functions() if fn.end_lineno - fn.lineno + 1 > MAX_LINES]
    too_many = [f"{p.name}:{fn.lineno} {fn.name} ({n_params(fn)} parameters)"
                for p, fn in functions() if n_params(fn) > MAX_PARAMS]
    assert not too_long, f"functions over {MAX_LINES} lines: {too_long}"
    assert not too_many, f"functions with more than {MAX_PARAMS} parameters: {too_many}"


def module_imports(path: Path) -> set:
    """nanobert modules that `path` imports at module level (imports inside functions
    are lazy: they run after every module has loaded, so they cannot form a cycle at
    import time; the test below checks them too, except model.py's from_pretrained)."""
    tree = ast.parse(path.read_text("utf-8"))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                out.add(node.module.split(".")[0])
            else:
                out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("nanobert."):
            out.add(node.module.split(".")[1])
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    return {m for m in out if m in modules and m != path.stem}


def import_graph(allowed=(("model", "checkpoint"),)) -> dict:
    graph = {p.stem: module_imports(p) for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    for a, b in allowed:
        graph[a].discard(b)
    return graph


def find_cycle(graph: dict):
    state = {}

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return path + [node, nxt]
            if nxt not in state:
                found = visit(nxt, path + [node])
                if found:
                    return found
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node, [])
            if found:
                return found
    return None


def test_no_import_cycle_between_modules():
    cycle = find_cycle(import_graph())
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


def test_the_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("path", sorted(PACKAGE.glob("*.py")), ids=lambda p: p.name)
def test_no_module_shadows_the_standard_library(path):
    import sys
    assert path.stem not in sys.stdlib_module_names or path.stem.startswith("__")


# modules whose behaviour is tested elsewhere, and where
NO_MIRROR = {
    "__init__": "test_readme.py (the public API, through the README's examples)",
    "__main__": "every CLI test (python -m nanobert)",
    "cli": "every CLI test, test_config.py (one-line errors)",
    "files": "test_rundir.py, test_readers.py (atomic writes, read_lines)",
    "demo": "test_finetune.py (the demo's reader, split and run on user files), test_rundir.py "
            "(its output directory)",
    "serve_models": "test_serve.py (models as served)",
    "threads": "test_serve.py and the CLI tests (--threads)",
}


def test_tests_mirror_modules():
    """tests/test_X.py for nanobert/X.py, so the tests of a module are found by its name."""
    tests = {p.stem[len("test_"):] for p in Path(__file__).parent.glob("test_*.py")}
    missing = sorted(p.stem for p in PACKAGE.glob("*.py")
                     if p.stem not in tests and p.stem not in NO_MIRROR)
    assert not missing, f"modules without tests/test_<module>.py: {missing}"
