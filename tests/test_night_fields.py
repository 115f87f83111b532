"""No untyped field in what a night hands between its phases or keeps (issue 64): every field
of the night's result and draft, of every record (`records.Record` and its subclasses), of
the context and its hand-overs, the weight phase's data and choice, the text phase's outcome
and the demo modes' result, and, through their field types, of every type of the night's own
(`selftaught.sleep.*`; another package's types are its own) they hold, has a type without
`Any`, `object` or a bare container. Dicts of anything are for the edge only (`ALLOWED`:
report.json keys a version does not type, a logged exchange as its client sent it); what is
not yet typed is named (`NOT_YET`); each entry of either is checked to still be there."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import pkgutil
import sys
import types
from collections.abc import Iterator, Mapping
from typing import Any, ForwardRef, get_args, get_type_hints, is_typeddict

import selftaught.sleep
from selftaught.record import Record
from selftaught.sleep.night.consolidate import Consolidation
from selftaught.sleep.night.demo_modes import ModeResult
from selftaught.sleep.night.phases.context import Harvest, NightContext, NightWindow, Splits
from selftaught.sleep.night.weight_night import WeightChoice, WeightData
from selftaught.sleep.result import NightDraft, NightResult

OWN = "selftaught.sleep."  # the night's own types: the walk goes into their fields

ALLOWED = frozenset(
    {
        # the edge: a report.json section's keys this version does not type, written back as
        # they came; `Summary` keeps its whole stored summary here (`EvalResult.summary()` of
        # any version, key for key as the golden report.json has it; `score` decodes it)
        "selftaught.record.Record.extra",
        # the edge: report.json's top-level keys this version does not know
        "selftaught.sleep.result.NightResult.extra",
        # the edge: a logged exchange as its client sent it (OpenAI messages, tools, free-form
        # meta), the intake log's row: what the night reads, not what it makes; not walked into
        "selftaught.sleep.intake.log.Interaction",
        # the edge: the request as a model reads it, chat messages in the shape every backend
        # takes (`models.base.Message`), sent as they are
        "selftaught.sleep.night.mine.MinedTask.messages",
    }
)
"""Fields (`module.Class.field`), or whole types the walk does not go into (`module.Class`),
whose types may hold `Any`: the edge, each entry says why."""

NOT_YET: frozenset[str] = frozenset()
"""Untyped fields that are not the edge, named until they are typed."""


def _type_checking_names(cls: type) -> dict[str, Any]:
    """The names each module of `cls`'s bases imports for type checking only."""
    names: dict[str, Any] = {}
    for base in cls.__mro__:
        module = sys.modules.get(base.__module__)
        if module is None or not base.__module__.startswith("selftaught."):
            continue
        for node in ast.parse(inspect.getsource(module)).body:
            if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
                found: dict[str, Any] = {"__name__": module.__name__}
                exec(compile(ast.Module(node.body, []), module.__name__, "exec"), found)
                names |= {k: v for k, v in found.items() if not k.startswith("__")}
    return names


def _fields(cls: type) -> Iterator[tuple[str, Any]]:
    """Each field of a dataclass or TypedDict, named by the class that declares it, with its
    resolved type."""
    hints = get_type_hints(cls, localns=_type_checking_names(cls))
    names = [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else hints
    for name in names:
        owner = next(c for c in cls.__mro__ if name in getattr(c, "__annotations__", {}))
        yield f"{owner.__module__}.{owner.__qualname__}.{name}", hints[name]


BARE = {dict, list, tuple, set, frozenset, Mapping}
NOT_WALKED = "allowed: not walked into"


def untyped(roots: list[type], own: str = OWN, allowed: frozenset[str] = ALLOWED) -> dict[str, str]:
    """`module.Class.field` → what is untyped in its type (`Any`, `object`, a bare container),
    for every field of `roots` and of the types of `own` (a module prefix) their fields hold;
    an `allowed` type met is named with `NOT_WALKED`."""
    found: dict[str, str] = {}
    seen: set[type] = set()

    def visit(t: Any, where: str) -> None:
        if t is Any or t is object:
            found.setdefault(where, "Any" if t is Any else "object")
        elif t in BARE:
            found.setdefault(where, f"a bare {getattr(t, '__name__', t)}")
        elif not isinstance(t, ForwardRef):  # a recursive alias (JsonValue): typed already
            for arg in get_args(t):
                if arg is not Ellipsis:
                    visit(arg, where)
            if isinstance(t, type) and not isinstance(t, types.GenericAlias):
                walk(t)

    def walk(cls: type) -> None:
        name = f"{cls.__module__}.{cls.__qualname__}"
        typed = dataclasses.is_dataclass(cls) or is_typeddict(cls)
        if cls in seen or not typed or not name.startswith(own):
            return
        seen.add(cls)
        if name in allowed:
            found[name] = NOT_WALKED
            return
        for where, t in _fields(cls):
            visit(t, where)

    for root in roots:
        walk(root)
    return found


def _records() -> list[type]:
    """Every record class of the night: `Record` and its subclasses, in each of its modules
    (not a test's own)."""
    for module in pkgutil.walk_packages(selftaught.sleep.__path__, OWN):
        importlib.import_module(module.name)
    out, todo = [], [Record]
    while todo:
        cls = todo.pop()
        out.append(cls)
        todo += cls.__subclasses__()
    return [c for c in out if c.__module__.startswith(OWN)]


ROOTS = [NightResult, NightDraft, NightContext, Harvest, Splits, NightWindow, WeightChoice,
         WeightData, Consolidation, ModeResult]  # fmt: skip


# a night's types as the walk meets them, to check it finds what it should
@dataclasses.dataclass
class _Inner:
    bare: dict
    nested: list[tuple[int, Mapping[str, Any]]]
    typed: Mapping[str, tuple[float, ...]]


@dataclasses.dataclass
class _Edge:
    anything: Any


@dataclasses.dataclass
class _Outer:
    loose: Any
    bag: dict[str, object]
    inner: list[_Inner] | None
    edge: _Edge
    fine: int | str | None = None


def test_the_walk_finds_any_object_and_bare_containers_through_field_types() -> None:
    here = f"{__name__}."
    found = untyped([_Outer], own=here, allowed=frozenset({f"{here}_Edge"}))
    assert found == {
        f"{here}_Outer.loose": "Any",
        f"{here}_Outer.bag": "object",
        f"{here}_Inner.bare": "a bare dict",
        f"{here}_Inner.nested": "Any",
        f"{here}_Edge": NOT_WALKED,
    }


def test_no_field_of_a_nights_results_records_or_hand_overs_is_untyped() -> None:
    records = {f"{c.__module__}.{c.__qualname__}" for c in _records()}
    assert len(records) > 50  # records.py's, and those of other modules (a weak label's)
    assert "selftaught.sleep.night.weak.WaitingLabel" in records
    found = untyped([*ROOTS, *_records()])
    known = ALLOWED | NOT_YET
    left = [f"{where}: {what}" for where, what in sorted(found.items()) if where not in known]
    assert not left, "untyped fields (type them, or say why they are the edge):\n" + "\n".join(left)


def test_each_allowed_entry_is_still_there_and_still_untyped() -> None:
    found = untyped([*ROOTS, *_records()])
    stale = [a for a in sorted(ALLOWED | NOT_YET) if a not in found]
    assert not stale, "allowed, but no longer met or typed now (drop them):\n" + "\n".join(stale)
    for name in ALLOWED:
        if found[name] == NOT_WALKED:  # a type: still holds something untyped
            module, _, cls = name.rpartition(".")
            assert untyped([getattr(sys.modules[module], cls)], allowed=frozenset()), name
