"""A coding agent as the optimizer (`--optimizer-model claude-code | codex | cmd:...`).

Where a chat analyst reflects and answers with edits in JSON, a coding agent edits the skill
itself. For each proposal it gets a scratch folder holding

- `SKILL.md` (`MEMORY.md` when the memory is trained): the parent's rules, and the package's
  `scripts/` and `references/` when the skill is a package (`selftaught.skill_package`; a
  skill that started as one file stays one: a file the agent adds beside it is refused);
- `rollouts/failed/NN.md` and `rollouts/passed/NN.md`: the step's attempts, one a file, as
  the analyst would read them (input, answer or tool calls, score, the grader's feedback),
  through the redactor;

and its instructions (`prompts/agent_edit.md`: the edit budget, the rejected edits, the
user's house rules) in its own instruction file (CLAUDE.md / AGENTS.md). It runs once,
non-interactively, in its own sandbox, like any agent rollout (`models.agents`).

Then the package is read back, no symlink followed, and the change is measured as a diff:
each block of consecutive changed lines (a hunk) in SKILL.md or a file becomes one `Edit`
whose target quotes the parent's text (`diff_edits`). From there the agent's edits take
the analyst's road: the guard, select under the edit budget (past the budget the later
hunks are dropped, in document order), apply, and the one gate. What it wrote outside the
package is not part of the candidate and is listed with the call; a file it left
executable is not (only the user's own package makes one executable); a symlink, a binary
or an oversized file is refused, naming it."""

from __future__ import annotations

import asyncio
import difflib
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from selftaught.models.agents.base import CliAgent
from selftaught.models.base import ChatModel, GenerationParams, Message
from selftaught.models.errors import FatalBackendError, TransientBackendError
from selftaught.redact import redact_for_model
from selftaught.rollout import Rollout
from selftaught.runs import Inside, PathRefused
from selftaught.skill.document import Edit, EditOp, tidy
from selftaught.skill.reflect import Analyst, AnalystCall, clip, format_rollouts
from selftaught.skill_package import (
    PACKAGE_DIRS,
    PackageError,
    PackageFile,
    check_text,
    file_spans,
    join_files,
    scan_files,
    split_files,
    write_files,
)
from selftaught.workspace import Workspace, changes, snapshot, using_workspace

ROLLOUT_FACTOR = 4  # a rollout file may hold this many times what an analyst prompt shows
PROMPT = (
    "Improve {file} in this folder as your instructions say; then reply with one short "
    "paragraph: what you changed and why."
)


def agent_of(model: ChatModel) -> CliAgent | None:
    """The CLI agent behind `model` (a tracked model is looked through), None for any other."""
    while not isinstance(model, CliAgent):
        inner = getattr(model, "inner", None)
        if inner is None:
            return None
        model = inner
    return model


# ---- the diff, as edits -------------------------------------------------------------------


def _context(lines: list[str], starts: list[int], text: str, k: int, end: int) -> int:
    """The first line from which `lines[k:end]` quotes the text where it stands: grown
    upwards until the quote, stripped, is not blank, starts a line without indentation
    (an edit's target is stripped) and is found first at its own place."""
    while k > 0:
        quote = "\n".join(lines[k:end])
        stripped = quote.strip()
        lead = len(quote) - len(quote.lstrip())
        if stripped and lead == 0 and text.find(stripped) == starts[k]:
            return k
        k -= 1
    return 0


@dataclass(frozen=True)
class Hunk:
    """One block of changed lines as an edit, with the lines it adds (what the guard reads:
    the quoted context around them is the parent's own text)."""

    edit: Edit
    added: str


def diff_edits(
    before: str, after: str, *, max_chars: int, doc: str = "SKILL.md"
) -> tuple[list[Hunk], list[dict[str, Any]]]:
    """One edit per hunk of the package `before` -> `after` (texts as `join_files` writes
    them), in document order, each quoting `before` so that applying them all to `before`,
    last first, gives `after` (blank lines aside). Each file is compared with itself: a
    changed file gives its hunks, a new one or a deleted one one hunk. Returns (hunks,
    invalid): a hunk whose new lines pass `max_chars` is invalid, saying so; a change of
    blank lines only is none."""
    a = before.split("\n")
    starts = [0]
    for line in a:
        starts.append(starts[-1] + len(line) + 1)
    hunks: list[Hunk] = []
    invalid: list[dict[str, Any]] = []
    for i1, i2, new, where in _package_changes(before, after, starts, doc):
        old = a[i1:i2]
        if [x for x in old if x.strip()] == [x for x in new if x.strip()]:
            continue
        added = "\n".join(new)
        if len(added) > max_chars:
            shown = {"op": "replace" if old else "insert", "content": clip(added, 300)}
            reason = f"a change of {len(added)} chars in {where}, over the {max_chars} cap"
            invalid.append({"edit": shown, "reason": reason})
            continue
        hunks.append(Hunk(_hunk_edit(a, starts, before, i1, i2, new, where), added))
    return hunks, invalid


def _package_changes(
    before: str, after: str, starts: list[int], doc: str
) -> list[tuple[int, int, list[str], str]]:
    """(i1, i2, new lines, where) for each change, lines `i1:i2` of `before` being replaced,
    sorted by place: the document's hunks, each kept file's, a deleted file's whole block, a
    new file's block where its path sorts."""
    a = before.split("\n")
    line = {offset: n for n, offset in enumerate(starts)}
    blocks = {
        path: (line[s], line[e] if e in line else len(a)) for s, e, path in file_spans(before)
    }
    old_files = dict(zip(blocks, split_files(before)[1], strict=True))
    new_text, new_files = split_files(after)
    md_end = min((h for h, _ in blocks.values()), default=len(a))
    out = [
        (i1, i2, new_text.split("\n")[j1:j2], doc)
        for i1, i2, j1, j2 in _changed(a[:md_end], new_text.split("\n"))
    ]
    new_by_path = {f.path: f for f in new_files}
    for path, (h, end) in blocks.items():  # end: the line after the closing marker
        if path not in new_by_path:
            out.append((h, end, [], f"{path} (deleted)"))
            continue
        body = _lines(new_by_path[path].text)
        for i1, i2, j1, j2 in _changed(_lines(old_files[path].text), body):
            out.append((h + 1 + i1, h + 1 + i2, body[j1:j2], path))
    for f in new_files:
        if f.path not in blocks:
            at = min((h for p, (h, _) in blocks.items() if p > f.path), default=len(a))
            out.append((at, at, f.block().split("\n")[:-1], f"{f.path} (new)"))
    return _anchored(a, sorted(out, key=lambda c: (c[0], c[1])))


def _anchored(
    a: list[str], changes: list[tuple[int, int, list[str], str]]
) -> list[tuple[int, int, list[str], str]]:
    """`changes` with an insertion that has no text above it to quote merged into the next
    change when that one touches the lines below it, the only ones it could quote."""
    out: list[tuple[int, int, list[str], str]] = []
    for change in changes:
        if out:
            i1, i2, new, where = out[-1]
            below = next((i for i in range(i2, len(a)) if a[i].strip()), len(a))
            bare = not "\n".join(a[i1:i2]).strip() and not "\n".join(a[:i1]).strip()
            if bare and change[0] <= below:
                out[-1] = (i1, change[1], [*new, *a[i2 : change[0]], *change[2]], where)
                continue
        out.append(change)
    return out


def _lines(text: str) -> list[str]:
    """A file's lines (its last line's end is no line of its own)."""
    return text[:-1].split("\n") if text.endswith("\n") else text.split("\n")


def _changed(a: list[str], b: list[str]) -> list[tuple[int, int, int, int]]:
    """The changed line ranges (i1, i2, j1, j2) of `a` -> `b`; two separated by blank lines
    only are one (a blank line is no change, and does not part two)."""
    out: list[tuple[int, int, int, int]] = []
    blank_gap = False
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            blank_gap = not any(x.strip() for x in a[i1:i2])
            continue
        if out and blank_gap:
            out[-1] = (out[-1][0], i2, out[-1][2], j2)
        else:
            out.append((i1, i2, j1, j2))
        blank_gap = False
    return out


def _hunk_edit(
    a: list[str], starts: list[int], text: str, i1: int, i2: int, new: list[str], where: str
) -> Edit:
    """The edit for lines `a[i1:i2]` of `text` becoming `new`, quoting `text` (an insertion
    when the lines replaced are blank, or none: a blank line is no change)."""

    def edit(op: EditOp, target: str = "", content: str = "") -> Edit:
        why = f"the agent's change to {where}"
        return Edit(op, content=content, target=target, source="agent", rationale=why)

    added = "\n".join(new)
    if not "\n".join(a[i1:i2]).strip():  # an insertion before line i2
        if not "\n".join(a[i2:]).strip():  # at the end
            return edit("append", content=added)
        if not "\n".join(a[:i1]).strip():  # before the first line: quote the lines after
            end = next(i + 1 for i in range(i2, len(a)) if a[i].strip())
            quote = "\n".join(a[i2:end])
            return edit("replace", quote, f"{added}\n{quote}")
        quote = "\n".join(a[_context(a, starts, text, i1 - 1, i1) : i1])
        return edit("insert_after", quote, added)
    k = _context(a, starts, text, i1, i2)
    quote = "\n".join(a[k:i2])
    content = "\n".join(a[k:i1] + new)
    if not content.strip():
        return edit("delete", quote)
    return edit("replace", quote, content)


# ---- the scratch folder -------------------------------------------------------------------


@dataclass(frozen=True)
class Scratch:
    """What one agent edit starts from: the folder's source (copied for each attempt), the
    document's file name, its text and the package's files, the ids of the rollouts shown
    and how many failed and passed."""

    source: Path
    file: str
    text: str
    files: tuple[PackageFile, ...]
    shown: tuple[str, ...]
    counts: tuple[int, int]


def _rollout_files(
    root: Path, kind: str, rollouts: Sequence[Rollout], limits: dict[str, int]
) -> None:
    """One Markdown file per rollout, as the analyst reads it (wider), through the redactor;
    named by position, never by a task's id (a row's id is a client's bytes)."""
    folder = root / "rollouts" / kind
    folder.mkdir(parents=True)
    wider = {k: v * ROLLOUT_FACTOR for k, v in limits.items()}
    for n, r in enumerate(rollouts, 1):
        block = format_rollouts([r], **wider).replace("### Task 1", f"# Task {n} ({kind})", 1)
        (folder / f"{n:02d}.md").write_text(redact_for_model(block) + "\n", encoding="utf-8")


def build_scratch(
    rules: str,
    file: str,
    failed: Sequence[Rollout],
    passed: Sequence[Rollout],
    limits: dict[str, int],
) -> Scratch:
    """The scratch folder's source: the document, the package's files (never executable
    here) and the rollouts."""
    text, files = split_files(rules)
    root = Path(tempfile.mkdtemp(prefix="selftaught-opt-"))
    (root / file).write_text(text, encoding="utf-8")
    write_files(root, files, executable=False)
    _rollout_files(root, "failed", failed, limits)
    _rollout_files(root, "passed", passed, limits)
    shown = tuple(r.example_id for r in [*failed, *passed])
    return Scratch(root, file, text, files, shown, (len(failed), len(passed)))


@dataclass(frozen=True)
class ReadBack:
    """The package as the agent left it: the document's text, the files (kept or refused)
    and what it wrote outside the package."""

    text: str
    files: tuple[PackageFile, ...]
    refused: tuple[dict[str, Any], ...]


OUTSIDE = "outside the skill package: not part of the candidate"
ONE_FILE = "the skill is one file, not a package (start from a package folder, --skill DIR)"


def read_back(
    root: Path, scratch: Scratch, changed: Sequence[str], ignore: Sequence[str], package: bool
) -> ReadBack:
    """The package in `root` after the run, read with no symlink followed. `changed` is what
    the run changed ('A path (+n)' lines, `workspace.changes`): a path outside the package,
    but for those in `ignore` (the instruction file selftaught wrote), is refused, and so is
    any file beside the document when the skill is no `package`."""
    with Inside(root) as inside:
        data = inside.read(scratch.file)
    if data is None:
        raise PackageError(f"the agent deleted {scratch.file}")
    text = check_text(scratch.file, data)
    files, problems = scan_files(root) if package else ({}, [])
    refused = [{"edit": {"path": p}, "reason": why} for p, why in problems]
    flags = {f.path: f.executable for f in scratch.files}  # exec bits left as the user gave
    kept = tuple(PackageFile(f.path, f.text, flags.get(f.path, False)) for f in files.values())
    for line in changed:
        path = line.split(" ", 1)[-1].rsplit(" (", 1)[0]
        inside_package = package and path.split("/", 1)[0] in PACKAGE_DIRS
        if line.startswith("...") or path == scratch.file or path in ignore or inside_package:
            continue
        why = ONE_FILE if path.split("/", 1)[0] in PACKAGE_DIRS else OUTSIDE
        refused.append({"edit": {"path": path}, "reason": why})
    return ReadBack(text, kept, tuple(refused))


# ---- one proposal -------------------------------------------------------------------------

DOC_FILES = {"skill": "SKILL.md", "memory": "MEMORY.md"}


class AgentEditor:
    """The analyst's model is a coding agent: each proposal is one run of it on a scratch
    folder, read back as edits (the analyst's guard applied), for `Proposer` to select,
    apply and gate as any other edits."""

    def __init__(self, analyst: Analyst, agent: CliAgent, *, package: bool = False):
        self.analyst = analyst  # its model is what is called: every run is charged
        self.agent = agent
        self.file = DOC_FILES[analyst.document]
        self.package = package  # the run's skill is a package: the agent may add files

    def instructions(self, scratch: Scratch, rejected: list[Edit], budget: int) -> str:
        package = self.package or bool(scratch.files)
        paths = ", ".join(f"`{f.path}`" for f in scratch.files)
        listed = f"- {paths}: the {self.analyst.document}'s files; edit or delete them.\n"
        return self.analyst.render_prompt(
            "agent_edit",
            rejected,
            file=self.file,
            package=listed if paths else "",
            package_files=" and files under `scripts/` and `references/`" if package else "",
            failed=scratch.counts[0],
            passed=scratch.counts[1],
            max_edits=budget,
        )

    async def edit(
        self,
        rules: str,
        failed: Sequence[Rollout],
        passed: Sequence[Rollout],
        rejected: list[Edit],
        budget: int,
    ) -> tuple[AnalystCall, str]:
        """One agent run on the parent's `rules`: the call (its edits, what was invalid or
        refused, the agent's reply and run) and the text its edits quote (`rules` with the
        package's files in path order, blank-line runs made one)."""
        limits = self.analyst.limits
        scratch = await asyncio.to_thread(build_scratch, rules, self.file, failed, passed, limits)
        base = tidy(join_files(scratch.text, scratch.files))  # quotes no later edit re-tidies
        call = AnalystCall(kind="agent", example_ids=list(scratch.shown))
        instructions = self.instructions(scratch, rejected, budget)
        call.prompt_chars = len(instructions)
        workspace = await asyncio.to_thread(Workspace.create, scratch.source)
        try:
            before = await asyncio.to_thread(snapshot, workspace.path)
            if not await self._run(call, workspace, instructions):
                return call, base
            after = await asyncio.to_thread(snapshot, workspace.path)
            changed = changes(before, after)
            ignore = (self.agent.instruction_file,)
            package = self.package or bool(scratch.files)
            try:
                back = await asyncio.to_thread(
                    read_back, workspace.path, scratch, changed, ignore, package
                )
            except (PackageError, PathRefused) as err:
                call.error = f"the agent's package was refused: {err}"
                return call, base
            new = join_files(back.text, back.files)
            limit = self.analyst.max_edit_chars
            hunks, invalid = diff_edits(base, new, max_chars=limit, doc=self.file)
            call.invalid = [*back.refused, *invalid]
            self._guard(call, hunks)
            return call, base
        finally:
            await asyncio.to_thread(workspace.remove)
            await asyncio.to_thread(shutil.rmtree, scratch.source, True)

    def _guard(self, call: AnalystCall, hunks: list[Hunk]) -> None:
        """The analyst's guard on the lines each hunk adds: no example's content, no echo."""
        guard = self.analyst.guard
        for hunk in hunks:
            why = guard.check(Edit("append", hunk.added)) if guard and hunk.added.strip() else None
            if why is None:
                call.edits.append(hunk.edit)
            else:
                call.refused.append({"edit": hunk.edit.to_dict(), "reason": why})

    async def _run(self, call: AnalystCall, workspace: Workspace, instructions: str) -> bool:
        """The agent's run in `workspace`; False (the call says why) when it did not finish."""
        messages: list[Message] = [
            {"role": "system", "content": instructions},
            {"role": "user", "content": PROMPT.format(file=self.file)},
        ]
        model, timeout = self.analyst.model, self.analyst.timeout_s
        try:
            with using_workspace(workspace):
                reply = await asyncio.wait_for(model.achat(messages, GenerationParams()), timeout)
        except FatalBackendError:
            raise
        except (TransientBackendError, asyncio.TimeoutError) as err:
            call.status, call.error = "backend_error", str(err) or "timed out"
            return False
        call.raw_reply = reply.text
        call.agent = dict(reply.extra.get("agent") or {})
        return True
