"""No dict between a night's phases (issue 64): a producer builds its frozen record, and no
code under `sleep/` turns one object into another through its dict (`X.from_dict(y.to_dict())`,
`X(**y.to_dict())`, the same through `asdict`, `records.plain` or an eval's `summary()`).
Dicts are for the edge: writing report.json, reading an older one."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "selftaught"
DUMPS = {"to_dict", "asdict", "plain", "summary"}
"""Calls that turn an object into its dict (`summary`: an eval's, `EvalResult.summary()`)."""

DECODERS = {
    "records.py Summary.of",  # the one reader of an eval's summary, as run directories store it
    "records.py GateRecord.result",
    "records.py AnalystRecord.stats",
    "records.py SlowRecord.update",
}
"""A section as report.json holds it, decoded by its domain type's one decoder (the reader of
every older shape), for report.md and the readers of old nights: the edge, not a run."""


def _dumped(node: ast.expr) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return name in DUMPS


def _scopes(tree: ast.Module) -> list[tuple[str, ast.AST]]:
    """Each top-level function and class method, named "function" or "Class.function"."""
    out: list[tuple[str, ast.AST]] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            out.append((node.name, node))
        elif isinstance(node, ast.ClassDef):
            methods = [n for n in node.body if isinstance(n, ast.FunctionDef)]
            out += [(f"{node.name}.{m.name}", m) for m in methods]
    return out


def round_trips(source: str, name: str) -> list[str]:
    """`from_dict` calls given a dict just made of an object, and calls given `**` of one,
    in `source`'s functions, as "name function: code" ("name Class.function: code")."""
    found = []
    for where, scope in _scopes(ast.parse(source, name)):
        for node in ast.walk(scope):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            from_dict = isinstance(func, ast.Attribute) and func.attr == "from_dict"
            if (from_dict and any(_dumped(a) for a in node.args)) or any(
                k.arg is None and _dumped(k.value) for k in node.keywords
            ):
                found.append(f"{name} {where}: {ast.unparse(node)}")
    return found


def test_the_scan_finds_each_round_trip() -> None:
    source = """
def a(y):
    return X.from_dict(y.to_dict())

def b(y):
    return X(**y.to_dict())

def c(y):
    return X.from_dict(plain(dataclasses.asdict(y)))

def d(y, d):
    return X.from_dict(d), X(**d), {"k": 1, **y.to_dict()}  # read, or a dict written
"""
    found = round_trips(source, "m.py")
    assert [f.split(":")[0] for f in found] == ["m.py a", "m.py b", "m.py c"]


def test_no_round_trip_through_a_dict_inside_a_night() -> None:
    found = []
    for path in sorted((SRC / "sleep").rglob("*.py")):
        name = str(path.relative_to(SRC / "sleep"))
        found += round_trips(path.read_text(), name)
    left = [f for f in found if f.split(":")[0] not in DECODERS]
    assert not left, "objects turned into others through their dict:\n" + "\n".join(left)


def test_a_record_built_in_code_writes_its_sections_keys_as_report_json_has_them() -> None:
    from selftaught.gate import GateResult
    from selftaught.sleep.records import PhaseRecord, VsAdoptedRecord

    not_run = PhaseRecord(document="memory", error="boom").only("document", "ran", "error")
    assert not_run.to_dict() == {"document": "memory", "ran": False, "error": "boom"}
    timed = not_run.but(seconds=1.5, ran=False)  # a key it lacked goes at its end
    assert list(timed.to_dict()) == ["document", "ran", "error", "seconds"]
    assert list(PhaseRecord(document="skill").but(seconds=1.0).to_dict())[-2:] == [
        "demo_modes",
        "error",
    ]  # built with every field: each stays where it is
    check = GateResult("accept", "ok", 0.5, 0.25, 0.25, 1.0, 1.0)
    vs = VsAdoptedRecord.vs("static", check)
    assert vs.to_dict() == {"mode": "static", **check.to_dict()}  # key for key, in order
    assert list(vs.to_dict()) == ["mode", *check.to_dict()]
