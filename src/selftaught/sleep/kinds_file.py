"""A project's kinds on disk, and the index a request is routed by.

    <home>/projects/<project>/kinds.json   every kind the project's nights found: its id, its
                                           heaviest words, its word centroid, when it was seen

The night finds the kinds and writes this file (`night/kinds.py`); the proxy routes each
request by it (`kind_index`, through `adoption/skill_units.project_router`). Both read it here,
below them: the file is what they share.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from selftaught.runs import RunError, atomic_write_json, read_json
from selftaught.skill.routing import KIND_SIMILARITY, KindIndex
from selftaught.sleep.paths import project_dir

KINDS_FILE = "kinds.json"
TAG_PREFIX = "kind:"


class KindsError(RunError):
    """The kinds file cannot be read (named)."""


def kind_tag(kind: str) -> str:
    """A kind's tag for the gate's per-tag veto (prefixed: it never meets a task's own tag)."""
    return f"{TAG_PREFIX}{kind}"


@dataclass(frozen=True)
class Kind:
    """One kind of request: its id (a valid skill name, never changed), its heaviest words,
    its word centroid, the first and last nights with traffic of it, and how many nights
    had some."""

    id: str
    terms: tuple[str, ...] = ()
    centroid: Mapping[str, float] = field(default_factory=dict)
    first_night: str = ""
    last_night: str = ""
    nights: int = 0

    @property
    def tag(self) -> str:
        return kind_tag(self.id)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "terms": list(self.terms),
            "centroid": dict(self.centroid),
            "first_night": self.first_night,
            "last_night": self.last_night,
            "nights": self.nights,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Kind:
        return cls(
            id=str(d["id"]),
            terms=tuple(str(t) for t in d.get("terms") or ()),
            centroid={str(w): float(v) for w, v in (d.get("centroid") or {}).items()},
            first_night=str(d.get("first_night") or ""),
            last_night=str(d.get("last_night") or ""),
            nights=int(d.get("nights") or 0),
        )


def kinds_path(project: str, home: Path | None = None) -> Path:
    return project_dir(project, home) / KINDS_FILE


def load_kinds(project: str, home: Path | None = None) -> tuple[Kind, ...]:
    """The project's kinds (none before its first night)."""
    return read_kinds(kinds_path(project, home))[0]


def read_kinds(path: Path) -> tuple[tuple[Kind, ...], float]:
    """A kinds file's kinds and the `similarity` its night used."""
    if not path.is_file():
        return (), KIND_SIMILARITY
    data = read_json(path)
    try:
        kinds = tuple(Kind.from_dict(d) for d in data["kinds"])
        similarity = float(data.get("similarity") or KIND_SIMILARITY)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise KindsError(f"{path}: not a kinds file ({err}); {_REDO}") from err
    if not 0.0 < similarity <= 1.0:
        raise KindsError(f"{path}: similarity {similarity} is not in (0, 1]; {_REDO}")
    return kinds, similarity


_REDO = "delete it and the next night finds the kinds again (new ids)"


def save_kinds(
    project: str,
    home: Path | None,
    kinds: Sequence[Kind],
    similarity: float = KIND_SIMILARITY,
) -> None:
    data = {"kinds": [k.to_dict() for k in kinds], "similarity": similarity}
    atomic_write_json(kinds_path(project, home), data)


def index_of(kinds: Sequence[Kind], similarity: float) -> KindIndex:
    """What a request is routed by: each kind's centroid, and the cosine that makes it one."""
    return KindIndex({k.id: dict(k.centroid) for k in kinds}, similarity)


_indexes: dict[Path, tuple[tuple[int, int, int], KindIndex | None]] = {}
_indexes_lock = threading.Lock()


def kind_index(project: str, home: Path | None = None) -> KindIndex | None:
    """The project's kinds as the proxy routes a request among them (None before its first
    night): read and indexed once, again only when kinds.json changes (a night replaces it
    atomically: a new inode, size or time), so routing a request rebuilds nothing. A file
    that cannot be read routes as none does (the next night names it)."""
    path = kinds_path(project, home)
    try:
        st = path.stat()
    except OSError:
        return None
    stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
    with _indexes_lock:
        cached = _indexes.get(path)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    try:
        kinds, similarity = read_kinds(path)
        index: KindIndex | None = index_of(kinds, similarity)
    except (RunError, OSError):  # KindsError, JSON that is not, a file gone since the stat
        index = None
    with _indexes_lock:
        _indexes[path] = (stamp, index)
    return index
