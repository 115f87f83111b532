"""The shape of the source tree: no import loop (between modules, between `sleep/`'s
sub-packages, between the benchmarks), no long function, no public class name defined twice
(all read with `ast`)."""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "selftaught"
BENCH = SRC.parents[1] / "benchmarks"
MAX_FUNCTION_LINES = 80
# cli.py commands the CLI rewrite (issue 18, item 4) replaces; nothing else may grow past the cap
LONG_FUNCTIONS_ALLOWED: set[tuple[str, str]] = set()


@functools.cache
def parsed(path: Path) -> ast.Module:
    """A source file's tree, parsed once a session: every scan here reads the same files and
    none changes a tree."""
    return ast.parse(path.read_text(), str(path))


def _modules() -> dict[str, Path]:
    out = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _resolve(target: str, modules: dict[str, Path]) -> str | None:
    """The module `target` names, or its nearest enclosing package in selftaught."""
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or None


def _outer_packages(target: str, importer: str) -> list[str]:
    """The packages Python runs before `target` (their `__init__`), less the root package and
    those the importer sits in (already running when it runs)."""
    parts = target.split(".")
    outer = [".".join(parts[:i]) for i in range(2, len(parts))]
    return [p for p in outer if not importer.startswith(p + ".")]


def _type_only_nodes(tree: ast.AST) -> set[int]:
    """The nodes under `if TYPE_CHECKING:` (annotations only, never run)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skipped


def import_graph() -> dict[str, set[str]]:
    """Module -> the selftaught modules it imports anywhere (module level, in a function, or
    under `if TYPE_CHECKING:`: a type-only circle is still a circle between layers)."""
    return {name: set(imported) for name, imported in _import_graph().items()}  # a fresh copy


@functools.cache
def _import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = parsed(path)
        type_only = _type_only_nodes(tree)
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package, up level-1 packages
                    pkg = _package_of(name, path).split(".")
                    pkg = pkg[: len(pkg) - node.level + 1]
                    base = ".".join(pkg + ([base] if base else []))
                # `from pkg import submodule` imports the submodule
                targets = [f"{base}.{alias.name}" for alias in node.names] or [base]
                targets = [t if t in modules else base for t in targets]
            for target in targets:
                resolved = _resolve(target, modules) if target.startswith("selftaught") else None
                if resolved and resolved != name:
                    graph[name].add(resolved)
                    if id(node) not in type_only:  # run: the packages around it run first
                        graph[name].update(_outer_packages(resolved, name))
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def test_import_graph_sees_package_and_function_imports():
    graph = import_graph()
    # a module-level import, a `from package import submodule`, and one inside a function
    assert "selftaught.sleep.intake.log" in graph["selftaught.sleep"]
    assert "selftaught.sleep.adoption.staging" in graph["selftaught.sleep.night.cycle"]
    assert "selftaught.tasks" in graph["selftaught.api"]
    # `from selftaught.sleep.paths import ...` runs selftaught.sleep's __init__ first
    assert _outer_packages("selftaught.sleep.intake.log", "selftaught.redact") == [
        "selftaught.sleep",
        "selftaught.sleep.intake",
    ]
    assert _outer_packages("selftaught.sleep.intake.log", "selftaught.sleep.night.cycle") == [
        "selftaught.sleep.intake"
    ]
    assert "selftaught.models" in graph["selftaught.weights.sft"]


def test_cycle_finder_finds_a_loop_through_three_modules():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycles(graph) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_loop():
    cycles = import_cycles(import_graph())
    assert not cycles, "modules that import each other (directly or round a loop): " + "; ".join(
        " <-> ".join(c) for c in cycles
    )


def layer_arrows(graph: dict[str, set[str]], root: str) -> dict[tuple[str, str], list[str]]:
    """The arrows between `root`'s layers (each module or sub-package directly inside it), each
    with the module imports that draw it. Every import counts, one in a function or under
    `if TYPE_CHECKING:` too: an import moved into a function still makes the layer it sits in
    lean on the one it names (and is how a loop gets dodged)."""

    def layer(module: str) -> str | None:
        if not module.startswith(root + "."):
            return None
        return root + "." + module[len(root) + 1 :].split(".")[0]

    arrows: dict[tuple[str, str], list[str]] = {}
    for module, deps in sorted(graph.items()):
        src = layer(module)
        for dep in sorted(deps):
            dst = layer(dep)
            if src and dst and src != dst:
                arrows.setdefault((src, dst), []).append(f"{module} -> {dep}")
    return arrows


def layer_loops(arrows: dict[tuple[str, str], list[str]]) -> list[str]:
    """Each loop between layers, named with the imports that close it."""
    graph: dict[str, set[str]] = {}
    for src, dst in arrows:
        graph.setdefault(src, set()).add(dst)
        graph.setdefault(dst, set())
    loops = []
    for cycle in import_cycles(graph):
        inside = [f"{'; '.join(why)}" for (a, b), why in sorted(arrows.items())
                  if a in cycle and b in cycle]  # fmt: skip
        loops.append(" <-> ".join(cycle) + ": " + " | ".join(inside))
    return loops


def test_layer_arrows_see_a_loop_through_sub_packages():
    graph = {
        "p.a.x": {"p.b.y"},
        "p.b.y": {"p.c"},
        "p.c": {"p.a.z"},
        "p.a.z": set(),
        "p.d": {"p.a.x"},
    }
    arrows = layer_arrows(graph, "p")
    assert arrows[("p.a", "p.b")] == ["p.a.x -> p.b.y"]
    assert layer_loops(arrows) == [
        "p.a <-> p.b <-> p.c: p.a.x -> p.b.y | p.b.y -> p.c | p.c -> p.a.z"
    ]
    del graph["p.c"]
    assert layer_loops(layer_arrows(graph, "p")) == []


def test_sleep_layers_import_one_way():
    """`sleep/`'s sub-packages and modules are layers: every arrow between two runs one way
    (store, paths and the records at the bottom, then adoption, intake, night, and what
    works over all of them: forget, move, the MCP server)."""
    loops = layer_loops(layer_arrows(import_graph(), "selftaught.sleep"))
    assert not loops, "sleep's layers that import each other:\n" + "\n".join(loops)


def bench_graph() -> dict[str, set[str]]:
    """Benchmark file -> the benchmark files it imports (they import each other by their bare
    names, `benchmarks/` on the path), anywhere in the file."""
    names = {path.stem for path in BENCH.glob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in names}
    for name in names:
        tree = ast.parse((BENCH / f"{name}.py").read_text(), name)
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                targets = [node.module]
            for target in targets:
                head = target.removeprefix("benchmarks.").split(".")[0]
                if head in names and head != name:
                    graph[name].add(head)
    return graph


def test_bench_graph_sees_module_and_function_imports():
    graph = bench_graph()
    assert "bench_quickstart" in graph["bench_busy"]  # at the top of the file
    assert "protocol" in graph["bench_tasks"]  # inside a function
    assert "common" in graph["tables"]


def test_benchmarks_import_one_way():
    cycles = import_cycles(bench_graph())
    assert not cycles, "benchmark files that import each other: " + "; ".join(
        " <-> ".join(c) for c in cycles
    )


def public_classes_defined_twice(root: Path = SRC) -> list[str]:
    """Public class names (no leading underscore) that two places in the package define."""
    where: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                rel = path.relative_to(root.parent).as_posix()
                where.setdefault(node.name, []).append(f"{rel}:{node.lineno}")
    return [f"{name}: {', '.join(places)}" for name, places in sorted(where.items())
            if len(places) > 1]  # fmt: skip


def test_the_twice_defined_scan_finds_one(tmp_path):
    pkg = tmp_path / "selftaught"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "a.py").write_text("class Score:\n    pass\nclass _Private:\n    pass\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    class Score: ...\nclass _Private: ...\n")
    assert public_classes_defined_twice(pkg) == ["Score: selftaught/a.py:1, selftaught/sub/b.py:2"]


def test_no_public_class_name_is_defined_twice():
    """One name, one class: a reader (or an import) never has to ask which `Score` it is."""
    twice = public_classes_defined_twice()
    assert not twice, "public class names defined more than once:\n" + "\n".join(twice)


def long_functions() -> list[tuple[str, str, int]]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        for node in ast.walk(parsed(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    found.append((rel, node.name, lines))
    return found


def test_no_function_over_80_lines():
    too_long = [f for f in long_functions() if f[:2] not in LONG_FUNCTIONS_ALLOWED]
    assert not too_long, f"functions over {MAX_FUNCTION_LINES} lines: {too_long}"


def private_imports(modules: dict[str, Path] | None = None) -> list[str]:
    """`from x import _name` where x is another selftaught module: a private name crossing
    a module boundary (dunders such as `__version__` are public)."""
    modules = modules if modules is not None else _modules()
    found = []
    for name, path in sorted(modules.items()):
        for node in ast.walk(parsed(path)):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = node.module or ""
            if node.level:
                pkg = _package_of(name, path).split(".")
                base = ".".join(pkg[: len(pkg) - node.level + 1] + ([base] if base else []))
            if not base.startswith("selftaught") or base == name:
                continue
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{name}:{node.lineno} imports {alias.name} from {base}")
    return found


def test_the_private_import_scan_finds_one(tmp_path):
    a = tmp_path / "selftaught" / "a.py"
    b = tmp_path / "selftaught" / "b.py"
    a.parent.mkdir()
    a.write_text("def _helper(): ...\nfrom selftaught.a import _helper as h\n")
    b.write_text("from selftaught.a import _helper\nfrom .a import _other\nfrom x import _y\n")
    found = private_imports({"selftaught.a": a, "selftaught.b": b})
    assert found == [
        "selftaught.b:1 imports _helper from selftaught.a",
        "selftaught.b:2 imports _other from selftaught.a",
    ]


def test_no_module_imports_another_modules_private_name():
    found = private_imports()
    assert not found, "private names imported across modules: " + "; ".join(found)


# Data flows one way (DESIGN.md): tasks and models know nothing of the optimizers, sleep or cli.
CORE = ("selftaught.tasks", "selftaught.models")
ABOVE_CORE = ("selftaught.skill", "selftaught.weights", "selftaught.sleep", "selftaught.cli")
# an adapter is merged into served weights with the trainer's own peft code (one way to load it)
# (importing weights.sft runs the weights package's __init__ too)
CORE_IMPORTS_ALLOWED = {
    ("selftaught.models.adapters", "selftaught.weights.sft"),
    ("selftaught.models.adapters", "selftaught.weights"),
}


def _within(module: str, packages: tuple[str, ...]) -> bool:
    """`module` is one of `packages` or inside one (`selftaught.skill_package` is not inside
    `selftaught.skill`)."""
    return any(module == p or module.startswith(p + ".") for p in packages)


def test_tasks_and_models_import_nothing_above_them():
    graph = import_graph()
    upward = sorted(
        (module, dep)
        for module, deps in graph.items()
        if _within(module, CORE)
        for dep in deps
        if _within(dep, ABOVE_CORE) and (module, dep) not in CORE_IMPORTS_ALLOWED
    )
    assert not upward, f"core modules importing optimizers, sleep or cli: {upward}"


_IMPORT_EACH_FIRST = """
import importlib, pkgutil, sys
import selftaught
names = [m.name for m in pkgutil.walk_packages(selftaught.__path__, "selftaught.")]
part, parts = int(sys.argv[1]), int(sys.argv[2])
failed = []
for name in names[part::parts]:
    if name.endswith("__main__"):  # runs the CLI
        continue
    for loaded in [m for m in sys.modules if m == "selftaught" or m.startswith("selftaught.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception as err:
        failed.append(f"{name}: {type(err).__name__}: {err}")
print("\\n".join(failed))
"""


@pytest.mark.slow  # a minute of imports on two cores: .ci/run runs it after the default tests
def test_every_module_imports_as_the_first_one():
    """The graph above sees the loops it is told about; this runs each import for real, as a
    program's first `import selftaught.x` would (a loop through a package's __init__ fails
    only there)."""
    parts = 2  # the modules split over two processes, run at once (CI has two cores)
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", _IMPORT_EACH_FIRST, str(part), str(parts)],
            stdout=subprocess.PIPE,
            text=True,
            cwd=SRC.parents[1],
        )
        for part in range(parts)
    ]
    out = "\n".join(run.communicate()[0].strip() for run in runs).strip()
    assert all(run.returncode == 0 for run in runs)
    assert not out, "modules that fail as a program's first import:\n" + out
