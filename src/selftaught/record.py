"""`Record`: a frozen dataclass that reads a JSON object and writes it back key for key.

Its known keys are typed fields, keys this version does not know (written by a newer one, or
by an older one that had more) are kept in `extra`, and the keys it was read with are
remembered in order (`read_keys`), so `Record.from_dict(d).to_dict()` equals `d` for every
object written today or before. A record built in code (not read) writes all of its fields,
in their order (`first` ones first), or the keys `only` names. The sections of a night's
report.json are records (`sleep/records.py`), and so is what a fine-tune reports
(`weights.rows.TrainStats`), which a night's adapter record extends.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar, TypeVar

_R = TypeVar("_R", bound="Record")
Decoder = Callable[[Any], Any]
_OWN = ("extra", "read_keys")


def plain(value: Any) -> Any:
    """`value` as JSON holds it: records as their dicts, tuples as lists."""
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, tuple | list):
        return [plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    return value


@dataclass(frozen=True, kw_only=True)
class Record:
    """A JSON object (a report section, a fine-tune's stats): typed fields, the keys it does
    not type, the keys it was read with."""

    extra: Mapping[str, Any] = field(default_factory=dict, repr=False)
    """Keys this version does not type, written back as they came."""
    read_keys: tuple[str, ...] | None = field(default=None, repr=False, compare=False)
    """The keys of the dict it was read from, in order (None: built in code)."""

    decoders: ClassVar[Mapping[str, Decoder]] = {}
    """Field name → how its JSON value becomes the typed one (a None stays None)."""
    renamed: ClassVar[Mapping[str, str]] = {}
    """JSON key → field name, for a key that cannot be a field's name (`from`)."""
    first: ClassVar[tuple[str, ...]] = ()
    """Fields a record built in code writes before the others (as its section always had)."""

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls) if f.name not in _OWN)

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """The JSON keys of the fields, in the fields' order."""
        field_key = {name: key for key, name in cls.renamed.items()}
        names = (*cls.first, *(n for n in cls.names() if n not in cls.first))
        return tuple(field_key.get(n, n) for n in names)

    @classmethod
    def from_dict(cls: type[_R], d: Mapping[str, Any]) -> _R:
        names = set(cls.names())
        known: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for key, value in d.items():
            name = cls.renamed.get(key, key)
            if name not in names:
                extra[key] = value
                continue
            decode = cls.decoders.get(name)
            known[name] = decode(value) if decode is not None and value is not None else value
        return cls(**known, extra=extra, read_keys=tuple(d))

    def only(self: _R, *keys: str) -> _R:
        """This record, built in code, writing `keys` alone in this order: a section whose
        keys say what happened (a phase that did not run has no scores)."""
        return replace(self, read_keys=keys)

    def but(self: _R, **changes: Any) -> _R:
        """This record with `changes`; one that writes some keys only (read, or `only`)
        writes a changed key it lacked at its end."""
        keys = self.read_keys
        if keys is not None:
            field_key = {name: key for key, name in self.renamed.items()}
            new = (field_key.get(n, n) for n in changes)
            keys = (*keys, *(k for k in new if k not in keys))
        return replace(self, **changes, read_keys=keys)

    @classmethod
    def empty(cls: type[_R]) -> _R:
        """The section as a report writes it when there is nothing to say: `{}`."""
        return cls.from_dict({})

    def to_dict(self) -> dict[str, Any]:
        order = (*self.keys(), *self.extra) if self.read_keys is None else self.read_keys
        return {
            k: plain(self.extra[k] if k in self.extra else getattr(self, self.renamed.get(k, k)))
            for k in order
        }
