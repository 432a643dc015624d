"""The package's shape, read from its imports (AST, nothing is imported): the layers
README's Layout states, no import cycle, no import of another file's private name, no
function-level import of our own code, a function-level import of another package only
with a `# deferred:` comment saying why (optional, or heavy off the import path), no
file over 400 lines, and no public function outside cli/ over 80 lines or 16 parameters."""
import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "perfcounter"

# Lowest first: a unit may import its own and lower units, never a higher one.
LAYERS = ["_util", "console", "format", "strict_yaml", "trace_args", "trace", "quant", "costs", "counting", "models",
          "devices", "pricing", "parallel", "simulation", "report", "stats_dict", "stats",
          "counts_doc", "timer", "counter", "generation", "serve", "plan", "cli", "__init__"]
MAX_LINES = 400


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _unit(module: str) -> str:
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


FILES = {_module(p): p for p in sorted(PACKAGE.rglob("*.py"))}
TREES = {m: ast.parse(p.read_text(), str(p)) for m, p in FILES.items()}


def _imports(module: str):
    """(imported module, name or None, node, at module level) for each import of ours."""
    tree = TREES[module]
    top = {id(n) for n in tree.body}
    top |= {id(n) for t in tree.body if isinstance(t, ast.Try) for n in t.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                target = f"{node.module}.{alias.name}"
                yield (target if target in FILES else node.module,
                       None if target in FILES else alias.name, node, id(node) in top)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None, node, id(node) in top


def _ours(module: str) -> bool:
    return module == "perfcounter" or module.startswith("perfcounter.")


def test_layers_import_downward_only():
    assert {_unit(m) for m in FILES} <= set(LAYERS), "a folder or file README's Layout lacks"
    rank = {u: i for i, u in enumerate(LAYERS)}
    upward = [f"{m} -> {target}" for m in FILES for target, _, _, _ in _imports(m)
              if _ours(target) and target in FILES and rank[_unit(target)] > rank[_unit(m)]]
    assert upward == []


def test_no_import_cycle():
    graph = defaultdict(set)
    for m in FILES:
        for target, _, _, _ in _imports(m):
            if _ours(target) and target in FILES and target != m and target != "perfcounter":
                graph[m].add(target)
    state, cycles = {}, []

    def visit(m, path):
        state[m] = "open"
        for n in sorted(graph[m]):
            if state.get(n) == "open":
                cycles.append(" -> ".join(path[path.index(n):] + [n]))
            elif n not in state:
                visit(n, path + [n])
        state[m] = "done"

    for m in sorted(FILES):
        if m not in state:
            visit(m, [m])
    assert cycles == []


def test_no_import_of_another_files_private_name():
    private = [f"{m}: {target}.{name}" for m in FILES for target, name, _, _ in _imports(m)
               if _ours(target) and name and name.startswith("_") and not name.startswith("__")]
    assert private == []


def test_function_level_imports_are_deferred_dependencies_with_a_reason():
    bad = []
    for m, path in FILES.items():
        lines = path.read_text().splitlines()
        for target, _, node, top in _imports(m):
            if top:
                continue
            text = lines[node.lineno - 1] + " " + lines[node.end_lineno - 1]
            if _ours(target) or "# deferred:" not in text:
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    assert bad == []


@pytest.mark.parametrize("path", [*FILES.values(), ROOT / "generate.py"],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_no_file_over_400_lines(path):
    assert len(path.read_text().splitlines()) <= MAX_LINES


MAX_FUNCTION_LINES, MAX_PARAMETERS = 80, 16  # many parameters are a config waiting to be named


def _public_functions(trees=None):
    """(module, name, lines from `def` to the body's end, parameters besides self/cls) of every
    public function and method outside cli/ (the commands' parsers are long by nature)."""
    for module, tree in (trees or TREES).items():
        if _unit(module) == "cli":
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                    and not node.name.startswith("_"):
                a = node.args
                names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
                params = len(names) - (names[:1] in (["self"], ["cls"]))
                yield module, node.name, node.end_lineno - node.lineno + 1, params


def test_no_public_function_over_80_lines_or_16_parameters():
    found = list(_public_functions())
    assert len(found) > 500  # the walk sees the package's functions
    too_long = [f"{m}.{n}: {lines} lines" for m, n, lines, _ in found if lines > MAX_FUNCTION_LINES]
    too_many = [f"{m}.{n}: {p} parameters" for m, n, _, p in found if p > MAX_PARAMETERS]
    assert too_long + too_many == []


def test_the_size_rule_counts_lines_and_parameters():
    tree = ast.parse("def f(a, b, *, c=1, **kw):\n    x = 1\n    return x\n"
                     "class C:\n    def m(self, a):\n        pass\n    def _p(self):\n        pass\n")
    cli = ast.parse("def parse(a):\n    pass\n")
    found = list(_public_functions({"perfcounter.toy": tree, "perfcounter.cli.toy": cli}))
    # f: def + 2 lines = 3, parameters a, b, c (**kw not one); m: 2 lines, a besides self;
    # _p private, cli/ left out
    assert found == [("perfcounter.toy", "f", 3, 3), ("perfcounter.toy", "m", 2, 1)]
