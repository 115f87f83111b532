"""Stage, adopt, roll back: where a night's proposal waits, and how it goes live.

    <home>/projects/<project>/
      nights/<night>/          one folder per night (the staging folder), see NIGHT_LAYOUT
      adopted/                 skill.md, memory.md, version: what the proxy injects (paths.py)
      versions/<N>/            skill.md, memory.md, meta.json of every adopted version N >= 1,
                               and adapter/ when N serves a LoRA adapter (version 0 is
                               "nothing adopted": the base model, no skill)
      backups/<time>-<what>/   the adopted files as they were before each adopt / rollback
      events.jsonl             every adopt and rollback
      live_targets.json        files that also receive the adopted skill (--target-skill-path)

Adopting writes `versions/<N>/` first (a temp folder renamed into place), then the adopted
skill.md and memory.md, then `version` last, each atomically, so a running proxy never reads
a half-adopted skill; a kill between those writes is completed by `recover_adopted` on the
next adopt or rollback. A proposal is adopted only over the version it was gated against.
Live files (e.g. an agent's AGENTS.md or SKILL.md) get the adopted skill and memory as one
marked block that replaces the previous one and leaves the rest of the file alone, byte for
byte: a rollback to version 0 gives back the file as it was before the first adopt. Every live
file is checked before anything is written (its block well formed, `inject.live_block_span`;
not a symlink unless `follow_symlinks`, and then the file it points to is what is remembered),
and adopted text holding a block marker is refused (`inject.check_no_markers`).

A weight night (`NightConfig.weights`, `weight_night.py`) whose gate chose an adapter stages
it beside the text proposal, and this is the contract adopt / serve / rollback read:

    nights/<night>/adapter/            the LoRA adapter, peft `save_pretrained` layout:
                                       adapter_config.json + adapter_model.safetensors
                                       (base_model_name_or_path inside names the base folder)
    nights/<night>/proposal/           skill.md / memory.md as always (the adopted ones when
                                       the winner is the adapter alone)
    report.json  proposal.adapter      {"dir": "adapter", "method": "sft" | "dpo",
                                        "base_model": the target spec ("local", "local:PATH"),
                                        "base_model_path": the transformers folder trained on,
                                        "files", "train_items": [task ids, train split only],
                                        "data", "training", "val": the winner's val summary
                                        (EvalResult.summary()), "with_text": bool}
    report.json  proposal.candidate    the winner: "text", "sft", "dpo", "sft+text", "dpo+text"
    report.json  weights               every candidate's val (95% intervals), gate results,
                                       the winner and why

Only a staged night whose `proposal.adapter` is set has an `adapter/` folder; the adapters
that lost are deleted (their metrics stay in `weights.trained`). Adopting copies it into
`versions/<N>/adapter/` before `version` names N, so the skill and the adapter switch
together; a text-only proposal carries the adapter of the version it was gated against
(each version is whole), and a rollback to a version serves that version's adapter or none.
`selftaught serve --project`, the proxy's local upstream (`adoption/serving.py`) and a vLLM
upstream with `--lora` follow the switch without a restart.

With a Postgres log ($SELFTAUGHT_LOG is a postgresql:// URL) the versions, the adopted pointer
and the events live in that database instead (`store/versions.py`: one row per version written
in one transaction, one pointer row per project), so every replica on every host serves the
same version; night folders, backups and live files stay on the host that ran the night.
"""

from __future__ import annotations

import contextlib
import difflib
import fcntl
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from selftaught.errors import InputError
from selftaught.record import plain
from selftaught.runs import (
    RunError,
    atomic_write_json,
    atomic_write_text,
    make_private,
    open_private_append,
    private_dirs,
    read_json,
)
from selftaught.sleep.adoption.inject import (
    BlockMarkerError,
    adopted_block,
    check_no_markers,
    live_block_span,
)
from selftaught.sleep.paths import (
    ADAPTER_DIR,
    Adopted,
    Owner,
    adopted_dir,
    as_unit,
    private_unit_dir,
    project_dir,
    sleep_home,
    unit_dir,
    version_adapter,
)
from selftaught.sleep.records import AdapterRecord, ModelSpecs
from selftaught.sleep.result import NIGHT_KIND as NIGHT_KIND  # read here by old callers
from selftaught.sleep.result import NightResult

if TYPE_CHECKING:
    from selftaught.sleep.store.versions import PgVersions

NIGHT_LAYOUT = """\
report.json        the night: status (running, staged, adopted, no_proposal, too_few_tasks,
                   backend_failed, failed, interrupted), why, window, models, tasks, splits,
                   gate, val before / after with 95% intervals, usage per role, budget
report.md          the same for people, with the proposal's diff
config.toml        the `sleep run` settings of the night (`--print-config`; `--config` reruns it)
diagnostics.json   per val task (hard, soft, reply head, why) before and after; every analyst
                   reply (raw); every backend call error; why nothing was proposed
evidence.jsonl     every model call of the night (role, messages, reply or error), redacted
tasks.jsonl        the mined tasks: split, checks, the interactions they came from
rows_read.txt      the ids of the interactions the night read, one a line (no content): how
                   `sleep log forget --everywhere` finds the nights that read a forgotten row
proposal/          skill.md and memory.md proposed, skill.diff and memory.diff against the
                   adopted ones (only when the night proposes something)
adapter/           the LoRA adapter the gate chose (weight nights only; peft layout:
                   adapter_config.json, adapter_model.safetensors), see proposal.adapter
weights/           weight nights: each adapter's val cache (weights/<method>/)
config.json, history.jsonl, skills/, best_skill.md, diagnostics/ ...
                   the skill phase: an `optimize` run directory (`selftaught report NIGHT`)
memory/            the memory phase: the same layout for the memory document
skills/<name>/     many skills (--skills): each skill's proposal/ (skill.md, SKILL.md,
                   memory.md, their diffs), its adapter/ when its weight gate chose one, and
                   its memory/ and weights/ runs; skillset/ holds the skills' text runs
"""
FINAL_STATUSES = (
    "staged",
    "adopted",
    "no_proposal",
    "too_few_tasks",
    "backend_failed",
    "failed",
    "interrupted",
)
ADVANCES_CURSOR = ("staged", "adopted", "no_proposal")  # the night used its interactions


class StagingError(InputError):
    """A staging request that cannot be done; the message says why (one sentence)."""


# ---- night folders ------------------------------------------------------------------------


def nights_dir(project: str, home: Path | None = None) -> Path:
    return project_dir(project, home) / "nights"


def new_night_id(home: Path, now: float | None = None) -> str:
    """A night id (local time, sortable) not used by any project yet."""
    base = time.strftime("%Y%m%d-%H%M%S", time.localtime(now or time.time()))
    used = {p.name for p in (home / "projects").glob("*/nights/*")}
    night, n = base, 1
    while night in used:
        n += 1
        night = f"{base}-{n}"
    return night


def read_report(night_dir: Path) -> dict[str, Any]:
    """report.json as the file holds it (every key, also ones this version does not know);
    `read_night` is the typed night."""
    path = night_dir / "report.json"
    try:
        data = read_json(path)
    except FileNotFoundError:
        raise StagingError(f"{night_dir} is not a night folder (no report.json)") from None
    except RunError as err:  # not JSON
        raise StagingError(f"{path} is malformed: {err}") from None
    if not isinstance(data, dict) or data.get("kind") != NIGHT_KIND:
        raise StagingError(f"{path} is not a night report")
    return data


def read_night(night_dir: Path) -> NightResult:
    """The night a staging folder holds, typed (any version's report.json)."""
    report = read_report(night_dir)
    project = str(report.get("project") or night_dir.parent.parent.name)
    try:
        return NightResult.from_report(project, night_dir, report)
    except (AttributeError, KeyError, TypeError, ValueError) as err:  # a section of odd shape
        raise StagingError(f"{night_dir / 'report.json'} is malformed: {err!r}") from None


def write_night(night: NightResult) -> None:
    """report.json of a night read with `read_night` (its keys kept, in their order)."""
    if night.night_dir is None:
        raise StagingError(f"night {night.night} of {night.project!r} has no folder to write")
    atomic_write_json(night.night_dir / "report.json", night.report_dict())


def list_nights(project: str, home: Path | None = None) -> list[tuple[Path, NightResult]]:
    """(folder, night) of every readable night of the project, oldest first."""
    out = []
    root = nights_dir(project, home)
    for path in sorted(root.iterdir()) if root.is_dir() else []:
        with contextlib.suppress(StagingError):
            out.append((path, read_night(path)))
    return out


def projects(home: Path | None = None) -> list[str]:
    root = (home or sleep_home()) / "projects"
    found = {p.name for p in root.iterdir() if p.is_dir()} if root.is_dir() else set()
    if (db := _db()) is not None:  # adopted on another host (skill units' keys hold a '/')
        found.update(p for p in db.projects() if "/" not in p)
    return sorted(found)


def mark_interrupted(project: str, home: Path | None = None) -> list[str]:
    """Nights still `running` while the caller holds the night lock died mid-way (killed,
    crashed): mark them `interrupted`. Returns their ids."""
    found = []
    for path, night in list_nights(project, home):
        if night.status == "running":
            why = (
                "the night stopped before it finished (killed or crashed); nothing was staged, "
                "and its interactions are read again by the next night"
            )
            write_night(replace(night, status="interrupted", reason=why))
            found.append(path.name)
    return found


def cursor(project: str, home: Path | None = None) -> float | None:
    """Where the next night starts reading: the end of the last night that used its
    interactions (None: no such night yet)."""
    ends = [
        n.consumed_until
        for _, n in list_nights(project, home)
        if n.status in ADVANCES_CURSOR and n.consumed_until is not None
    ]
    return max(ends) if ends else None


def last_models(project: str, home: Path | None = None) -> tuple[str, ModelSpecs] | None:
    """(night, models) of the newest night that recorded its models."""
    for path, night in reversed(list_nights(project, home)):
        models = night.models
        if models is not None and models.read_keys != () and night.status not in _UNFINISHED:
            return path.name, models
    return None


_UNFINISHED = ("running", "interrupted")


def own_proposal(night: NightResult) -> bool:
    """The night proposes something for the project itself (a night that staged only some of
    its many skills, `skills`, does not)."""
    return night.proposal is not None or not night.skills


def resolve_night(project: str, night_id: str | None, home: Path | None = None) -> Path:
    """A night folder by id (or a unique prefix); None: the newest staged, unadopted one."""
    nights = list_nights(project, home)
    if night_id is None:
        staged = [p for p, n in nights if n.status == "staged" and own_proposal(n)]
        if not staged:
            raise StagingError(
                f"project {project!r} has no staged proposal waiting "
                "(`selftaught sleep history` lists the nights)"
            )
        return staged[-1]
    hits = [p for p, _ in nights if p.name == night_id] or [
        p for p, _ in nights if p.name.startswith(night_id)
    ]
    if len(hits) != 1:
        known = ", ".join(p.name for p, _ in nights[-5:]) or "none"
        what = "is ambiguous" if hits else "does not exist"
        raise StagingError(
            f"night {night_id!r} {what} in project {project!r} (latest nights: {known})"
        )
    return hits[0]


def unified_diff(old: str, new: str, name: str) -> str:
    return "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True),
            new.splitlines(keepends=True),
            fromfile=f"adopted/{name}",
            tofile=f"proposal/{name}",
        )
    )


def write_proposal(night_dir: Path, adopted: Adopted, skill: str, memory: str) -> dict[str, Any]:
    """proposal/skill.md, memory.md and their diffs against the adopted ones; text holding a
    block marker is refused (`BlockMarkerError`)."""
    folder = night_dir / "proposal"
    changed = {}
    check_no_markers(skill, "the proposed skill")
    check_no_markers(memory, "the proposed memory")
    for name, old, new in (("skill", adopted.skill, skill), ("memory", adopted.memory, memory)):
        atomic_write_text(folder / f"{name}.md", new)
        atomic_write_text(folder / f"{name}.diff", unified_diff(old, new, f"{name}.md"))
        changed[name] = old.strip() != new.strip()
    return changed


# ---- adopted versions -----------------------------------------------------------------------


def versions_store() -> PgVersions | None:
    """The Postgres versions store when $SELFTAUGHT_LOG is a URL, else None (files here)."""
    from selftaught.sleep.paths import shared_url
    from selftaught.sleep.store import versions

    return versions.store(shared_url())


_db = versions_store


@contextlib.contextmanager
def adopt_lock(project: Owner, home: Path | None) -> Iterator[None]:
    """One adopt or rollback of a unit at a time (on every host with a Postgres log)."""
    if (db := _db()) is not None:
        with db.lock(as_unit(project).key):
            yield
        return
    folder = private_unit_dir(project, home)
    fd = os.open(folder / "adopt.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def read_text(path: Path) -> str:
    """A staged or adopted file's text ("" when it is absent)."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ""


_read = read_text


def read_adopted_files(project: Owner, home: Path | None = None) -> Adopted:
    """The adopted files as they are on disk now (no cache)."""
    if (db := _db()) is not None:
        return db.current(as_unit(project).key, versions_dir(project, home))
    folder = adopted_dir(project, home)
    version = _read(folder / "version").strip() or None
    adapter = version_adapter(project, version, home)
    return Adopted(_read(folder / "skill.md"), _read(folder / "memory.md"), version, adapter)


def versions_dir(project: Owner, home: Path | None = None) -> Path:
    return unit_dir(project, home) / "versions"


def version_numbers(project: Owner, home: Path | None = None) -> list[int]:
    if (db := _db()) is not None:
        return db.numbers(as_unit(project).key)
    root = versions_dir(project, home)
    found = [int(p.name) for p in root.iterdir() if p.name.isdigit()] if root.is_dir() else []
    return sorted(found)


def read_version(project: Owner, version: int, home: Path | None = None) -> Adopted:
    if version == 0:
        return Adopted("", "", "0")
    db, unit = _db(), as_unit(project)
    found = db.read(unit.key, version, versions_dir(unit, home)) if db is not None else None
    if found is not None:
        return found
    folder = versions_dir(project, home) / str(version)
    if db is not None or not (folder / "meta.json").is_file():
        known = ", ".join(str(v) for v in [0, *version_numbers(project, home)])
        raise StagingError(f"{unit.label} has no adopted version {version} (known: {known})")
    adapter = version_adapter(project, str(version), home)
    return Adopted(_read(folder / "skill.md"), _read(folder / "memory.md"), str(version), adapter)


def version_meta(project: Owner, version: int, home: Path | None = None) -> dict[str, Any]:
    """An adopted version's meta.json (night, val, what it replaced, its adapter); {} for
    version 0 or a version adopt did not write."""
    if (db := _db()) is not None:
        return db.meta(as_unit(project).key, version) if version > 0 else {}
    path = versions_dir(project, home) / str(version) / "meta.json"
    return read_json(path) if version > 0 and path.is_file() else {}


def current_version(project: Owner, home: Path | None = None) -> int:
    """The adopted version number (0: nothing adopted, or a version not written by adopt)."""
    return read_adopted_files(project, home).number


def recover_adopted(project: Owner, home: Path | None = None) -> str | None:
    """Complete an adopt or rollback that was killed between writing the adopted documents
    and the `version` file: when the documents equal a known version other than the one
    named, name it. Returns what was done, or None (always with a Postgres log: each step is
    one transaction there)."""
    if _db() is not None:
        return None
    on_disk = read_adopted_files(project, home)
    named = current_version(project, home)
    candidates = [named] + [v for v in reversed([0, *version_numbers(project, home)]) if v != named]
    for v in candidates:
        with contextlib.suppress(StagingError):
            known = read_version(project, v, home)
            if known.skill == on_disk.skill and known.memory == on_disk.memory:
                if v == named and (on_disk.version or "0") == str(v):
                    return None
                atomic_write_text(adopted_dir(project, home) / "version", f"{v}\n")
                return f"completed an interrupted adopt: the adopted files are version {v}"
    return None


def adopted_consistent(project: Owner, home: Path | None = None) -> bool:
    """The adopted files equal the version they name (hand edits or a torn adopt: False)."""
    on_disk = read_adopted_files(project, home)
    if on_disk.version is None and on_disk.empty:
        return True
    try:
        known = read_version(project, current_version(project, home), home)
    except StagingError:
        return False
    return known.skill == on_disk.skill and known.memory == on_disk.memory


def _backup(project: Owner, home: Path | None, what: str) -> Path:
    folder = adopted_dir(project, home)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    dest = unit_dir(project, home) / "backups" / f"{stamp}-{what}"
    n = 1
    while dest.exists():
        n += 1
        dest = dest.with_name(f"{stamp}-{what}-{n}")
    private_dirs(dest.parent)
    dest.mkdir(mode=0o700)
    if (db := _db()) is not None:  # the adopted version as the database serves it
        now = db.current(as_unit(project).key, versions_dir(project, home))
        texts = {"skill.md": now.skill, "memory.md": now.memory, "version": f"{now.version}\n"}
        for name, text in texts.items() if now.version is not None else ():
            atomic_write_text(dest / name, text)
        return dest
    for name in ("skill.md", "memory.md", "version"):
        if (folder / name).exists():
            shutil.copy2(folder / name, dest / name)
    return dest


def _write_adopted(project: Owner, home: Path | None, adopted: Adopted) -> None:
    """skill.md and memory.md first, `version` last, each atomically (see paths.py); with a
    Postgres log, the unit's pointer row."""
    if (db := _db()) is not None:
        db.point(as_unit(project).key, int(str(adopted.version)))
        return
    folder = adopted_dir(project, home)
    atomic_write_text(folder / "skill.md", adopted.skill)
    atomic_write_text(folder / "memory.md", adopted.memory)
    atomic_write_text(folder / "version", f"{adopted.version}\n")


def _write_version(
    project: Owner, home: Path | None, adopted: Adopted, meta: dict[str, Any], adapter: Path | None
) -> None:
    """versions/<N>/ complete (skill, memory, meta, a copy of the adapter) or not at all;
    with a Postgres log, its row and its adapter's files in one transaction."""
    if (db := _db()) is not None:
        db.write_version(as_unit(project).key, adopted, meta, adapter)
        return
    root = private_dirs(versions_dir(project, home))
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=".new-"))
    try:
        atomic_write_text(tmp / "skill.md", adopted.skill)
        atomic_write_text(tmp / "memory.md", adopted.memory)
        if adapter is not None:
            shutil.copytree(adapter, tmp / ADAPTER_DIR)
            make_private(tmp / ADAPTER_DIR)
        atomic_write_json(tmp / "meta.json", meta)
        os.rename(tmp, root / str(adopted.version))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def record_event(project: Owner, row: dict[str, Any], home: Path | None = None) -> None:
    """Append one row (with its time) to events.jsonl: adopt, rollback, auto_rollback."""
    if (db := _db()) is not None:
        db.record_event(as_unit(project).key, row)
        return
    path = unit_dir(project, home) / "events.jsonl"
    with open_private_append(path) as f:  # 0600, as everything under the home
        f.write(json.dumps({"time": time.time(), **row}, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def events(project: Owner, home: Path | None = None) -> list[dict[str, Any]]:
    if (db := _db()) is not None:
        return db.events(as_unit(project).key)
    path = unit_dir(project, home) / "events.jsonl"
    rows = []
    for line in _read(path).splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            rows.append(json.loads(line))
    return rows


# ---- live files -----------------------------------------------------------------------------


def live_targets(project: Owner, home: Path | None = None) -> list[Path]:
    path = unit_dir(project, home) / "live_targets.json"
    return [Path(p) for p in read_json(path)] if path.is_file() else []


def _live_paths(
    project: Owner, home: Path | None, given: list[Path], follow_symlinks: bool
) -> list[Path]:
    """The remembered live files and the ones given now (absolute, a symlink refused unless
    `follow_symlinks`: then the file it points to), each a file we may write."""
    known = live_targets(project, home)
    for p in given:
        p = Path(os.path.abspath(p.expanduser()))
        if p not in known:
            known.append(p)
    out: list[Path] = []
    for p in known:
        if p.is_symlink():
            if not follow_symlinks:
                raise StagingError(
                    f"--target-skill-path {p} is a symlink (to {os.readlink(p)}); nothing was "
                    "changed: give the file itself, or pass --follow-symlinks to write where "
                    "it points (that file is then remembered)"
                )
            p = p.resolve()
        if p.is_dir():
            raise StagingError(f"--target-skill-path {p} is a directory; give a file")
        if p not in out:
            out.append(p)
    return out


def live_text(path: Path, adopted: Adopted) -> str | None:
    """What `path` holds once `adopted` is in it (None: leave it as it is): its block replaced,
    added at the end (after a newline) or removed with that newline; the rest byte for byte.
    Raises `BlockMarkerError` (nothing written) when its block is not well formed."""
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        text = ""
    except UnicodeDecodeError as err:
        raise StagingError(f"--target-skill-path {path} is not UTF-8 text ({err.reason})") from None
    block = adopted_block(adopted)
    span = live_block_span(text, str(path))
    if span is None:
        if not block:
            return None
        return f"{text}\n{block}\n" if text else f"{block}\n"
    start, end = span
    if block:
        return text[:start] + block + "\n" + text[end:]
    cut = start - 1 if start > 0 and text[start - 1] == "\n" else start  # the newline we added
    return text[:cut] + text[end:]


def write_live_file(path: Path, adopted: Adopted) -> None:
    """Put the adopted skill and memory in `path` as one marked block (`live_text`)."""
    text = live_text(path, adopted)
    if text is not None:
        atomic_write_text(path, text)


# ---- adopt / rollback -------------------------------------------------------------------------


@dataclass
class Adoption:
    version: int
    previous: int
    night: str | None
    backup: Path
    live_files: list[Path]
    note: str | None = None  # e.g. an interrupted adopt completed first
    # the user's files (write_back.py): written by an adopt (WrittenBack), put back by a
    # rollback (placement.PlacedFile)
    written_back: list[Any] = field(default_factory=list)
    restored: list[Any] = field(default_factory=list)


@dataclass
class _LivePlan:
    """Every live file with its new text, checked before anything is written."""

    paths: list[Path]
    texts: list[str | None]


def _plan_live(
    project: Owner, home: Path | None, adopted: Adopted, given: list[Path], follow_symlinks: bool
) -> _LivePlan:
    for text, what in ((adopted.skill, "skill"), (adopted.memory, "memory")):
        try:
            check_no_markers(text, f"the {what} of version {adopted.version}")
        except BlockMarkerError as err:
            raise StagingError(f"{err}; nothing was changed") from None
    paths = _live_paths(project, home, given, follow_symlinks)
    try:
        return _LivePlan(paths, [live_text(p, adopted) for p in paths])
    except BlockMarkerError as err:
        raise StagingError(str(err)) from None


def _go_live(project: Owner, home: Path | None, adopted: Adopted, plan: _LivePlan) -> list[Path]:
    _write_adopted(project, home, adopted)
    if plan.paths:
        path = unit_dir(project, home) / "live_targets.json"
        atomic_write_json(path, [str(p) for p in plan.paths])
    for live, text in zip(plan.paths, plan.texts, strict=True):
        if text is not None:
            atomic_write_text(live, text)
    return plan.paths


def _check_adoptable(
    project: str, night_dir: Path, night: NightResult, force: bool, home: Path | None
) -> int:
    """The adopted version now, once the night is known to be adoptable over it."""
    status = night.status
    if status == "adopted":
        raise StagingError(
            f"night {night_dir.name} is already adopted as version {night.adopted_version}"
        )
    if status != "staged":
        raise StagingError(
            f"night {night_dir.name} has nothing to adopt (status {status}: "
            f"{night.reason or 'no proposal'})"
        )
    if not own_proposal(night):
        raise StagingError(
            f"night {night_dir.name} staged skills only: adopt each with "
            "`selftaught sleep adopt --skill NAME` (`sleep status` lists them)"
        )
    previous = current_version(project, home)
    base = int(night.base_version or 0)
    if previous != base and not force:
        raise StagingError(
            f"the adopted version changed since night {night_dir.name} ran (it was gated "
            f"against version {base}, version {previous} is adopted now); run another "
            "night, or pass --force to adopt it anyway"
        )
    return previous


def _staged_adapter(night: NightResult) -> AdapterRecord | None:
    staged = night.proposal.adapter if night.proposal is not None else None
    return staged if staged is not None and staged.read_keys != () else None


def staged_adapter(night_dir: Path, night: NightResult) -> Path | None:
    """The adapter folder a staged night proposes (None: a text-only proposal)."""
    staged = _staged_adapter(night)
    return night_dir / str(staged.dir or ADAPTER_DIR) if staged is not None else None


def _proposed_adapter(
    project: str, night_dir: Path, night: NightResult, previous: int, home: Path | None
) -> tuple[Path | None, dict[str, Any] | None]:
    """The adapter the project's new version serves (`proposed_adapter`)."""
    folder = staged_adapter(night_dir, night)
    return proposed_adapter(project, night_dir.name, folder, _staged_adapter(night), previous,
                            home)  # fmt: skip


def proposed_adapter(
    unit: Owner,
    night_id: str,
    folder: Path | None,
    staged: AdapterRecord | None,
    previous: int,
    home: Path | None,
) -> tuple[Path | None, dict[str, Any] | None]:
    """The adapter a unit's new version serves, and its metadata: the night's own (`folder`,
    `staged`) when its gate chose one, else the one the previous version served (a text
    proposal was gated with it)."""
    if folder is not None and staged is not None:
        if not (folder / "adapter_config.json").is_file():
            raise StagingError(
                f"night {night_id} proposes an adapter but {folder} holds none "
                "(adapter_config.json missing); nothing was adopted"
            )
        keep = ("method", "base_model", "base_model_path", "train_items", "val", "with_text")
        written = staged.to_dict()  # meta.json keeps them as report.json wrote them
        return folder, {"night": night_id, **{k: written.get(k) for k in keep}}
    folder = version_adapter(unit, str(previous), home)
    if folder is None:
        return None, None
    meta = version_meta(unit, previous, home).get("adapter")
    return folder, {**(meta or {}), "carried_from": previous}


def adopt(
    project: str,
    night_id: str | None = None,
    *,
    home: Path | None = None,
    force: bool = False,
    target_paths: list[Path] | tuple[Path, ...] = (),
    follow_symlinks: bool = False,
    meta: dict[str, Any] | None = None,
) -> Adoption:
    """Make a staged night's proposal (skill, memory, adapter) the adopted version N+1. The
    live files are checked first: a bad one (a symlink without `follow_symlinks`, a block not
    well formed) or a proposal holding a block marker changes nothing. `meta`: more for the
    version's meta.json (e.g. the user's file written back, `write_back.py`)."""
    with adopt_lock(project, home):
        note = recover_adopted(project, home)
        night_dir = resolve_night(project, night_id, home)
        staged = read_night(night_dir)
        previous = _check_adoptable(project, night_dir, staged, force, home)
        adapter, adapter_meta = _proposed_adapter(project, night_dir, staged, previous, home)
        skill = _read(night_dir / "proposal" / "skill.md")
        memory = _read(night_dir / "proposal" / "memory.md")
        proposal, gate = staged.proposal, staged.gate
        meta = {
            **(meta or {}),
            "night": night_dir.name,
            "val_before": plain(proposal.val_before) if proposal is not None else None,
            "val_after": plain(proposal.val_after) if proposal is not None else None,
            "gate": gate.mode if gate is not None and gate.read_keys != () else None,
            # `--no-val`: nothing checked it before it went live; probation may roll it back
            **({"probation": "auto_rollback"} if gate is not None and gate.no_val else {}),
            "models": plain(staged.models),
            "adapter": adapter_meta,
        }
        live = LiveFiles(list(target_paths), follow_symlinks)
        done = install_version(project, home, skill, memory, meta, adapter, previous, live)
        write_night(
            replace(staged, status="adopted", adopted_version=done.version, adopted_at=time.time())
        )
        done.note = note
        return done


@dataclass(frozen=True)
class LiveFiles:
    """The live files an adopt or rollback also writes (given now; remembered ones too)."""

    given: list[Path]
    follow_symlinks: bool = False


def install_version(
    unit: Owner,
    home: Path | None,
    skill: str,
    memory: str,
    meta: dict[str, Any],
    adapter: Path | None,
    previous: int,
    live: LiveFiles,
) -> Adoption:
    """Adopt `skill` / `memory` (and `adapter`) as the unit's next version, the caller holding
    its `adopt_lock`: live files checked first, a backup, `versions/<N>/` whole, the adopted
    files, an `adopt` event. `meta` (night, val, ...) goes into the version's meta.json."""
    version = max([0, *version_numbers(unit, home)]) + 1
    new = Adopted(skill, memory, str(version))
    plan = _plan_live(unit, home, new, live.given, live.follow_symlinks)
    backup = _backup(unit, home, f"before-v{version}")
    meta = {"version": version, "adopted_at": time.time(), **meta, "replaced": previous}
    _write_version(unit, home, new, meta, adapter)
    written = _go_live(unit, home, new, plan)
    event = {"event": "adopt", "version": version, "night": meta.get("night")}
    event.update(previous=previous, adapter=bool(adapter), backup=str(backup))
    record_event(unit, event, home)
    return Adoption(version, previous, meta.get("night"), backup, written)


def rollback(
    project: Owner,
    version: int | None = None,
    *,
    home: Path | None = None,
    target_paths: list[Path] | tuple[Path, ...] = (),
    follow_symlinks: bool = False,
) -> Adoption:
    """Return to an earlier adopted version (default: the one below the current; 0 removes
    the adopted skill and memory, and the block from every live file); live files are checked
    first, as for `adopt`."""
    with adopt_lock(project, home):
        note = recover_adopted(project, home)
        previous = current_version(project, home)
        if version is None:
            lower = [v for v in version_numbers(project, home) if v < previous]
            if previous == 0:
                raise StagingError(f"{as_unit(project).label} has nothing adopted to roll back")
            version = lower[-1] if lower else 0
        if version < 0:
            raise StagingError("a version is a number >= 0")
        target = read_version(project, version, home)
        if version == previous and adopted_consistent(project, home):
            raise StagingError(f"version {version} is already the adopted one")
        plan = _plan_live(project, home, target, list(target_paths), follow_symlinks)
        backup = _backup(project, home, f"before-rollback-to-v{version}")
        live = _go_live(project, home, target, plan)
        record_event(
            project,
            {"event": "rollback", "version": version, "previous": previous, "backup": str(backup)},
            home,
        )
        return Adoption(version, previous, None, backup, live, note)


def history(project: Owner, home: Path | None = None) -> list[dict[str, Any]]:
    """One row per adopted version (0 = nothing adopted), with its night and val scores."""
    current = current_version(project, home)
    rows = [
        {
            "version": 0,
            "night": None,
            "adopted_at": None,
            "val_before": None,
            "val_after": None,
            "adapter": None,
            "current": current == 0,
        }
    ]
    for v in version_numbers(project, home):
        rows.append({**version_meta(project, v, home), "version": v, "current": v == current})
    return rows
