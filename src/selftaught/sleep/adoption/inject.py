"""The adopted skill and memory in a client's request, rendered as the policy renders them
(`selftaught.policy.Policy`, the one the night gated), and marked so they can be stripped:

    <!-- selftaught:skill version=3 turns=4 -->
    ...the skill's rules (and its demos, when they are placed in the system prompt)...
    <!-- /selftaught:skill -->
    <!-- selftaught:memory version=3 -->
    ...the memory...
    <!-- /selftaught:memory -->

    ...the client's own system message...

The block is prepended to the client's first system (or developer) message, or sent as a new
system message when the client has none. A skill whose demos are placed as turns adds them as
prior user/assistant turns right after that message; `turns=N` in the marker counts them, so
`strip_injected_messages` removes them again. A skill whose demos are a retrieval pool
(`retrieve=K`) shows, per request, the K demos most similar to it. The client's messages are
never modified in place.

A project with many skills (`adoption/skill_units.py`) gets, after its own block, the one skill
the proxy's router picked for the request (`RoutedSkill`), marked the same way with its name
(`<!-- selftaught:skill name=sql-queries version=2 -->`), then that skill's memory when it has
one (`<!-- selftaught:memory name=sql-queries version=2 -->`), so stripping removes them too;
its demo turns follow the project's (each block's `turns=N` is counted).

A live file (`--target-skill-path`, e.g. AGENTS.md) cannot hold turns: it gets the demos as a
"Worked examples" section (`adopted_block`).

The markers are the block's only boundary, so adopted text may not hold anything that reads as
one (`find_marker`: a memory line "<!-- /selftaught:memory -->" would end the block early and
leave what follows it outside, in every request and in a live file after a rollback); adopt
refuses such text (`check_no_markers`). In a live file the block is matched strictly
(`live_block_span`): marker lines of their own, one start and one end per block, in order, else
the file is not touched.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from selftaught.demos import Demo, demo_section, split_skill
from selftaught.errors import InputError
from selftaught.models.base import Message
from selftaught.policy import Policy
from selftaught.sleep.paths import Adopted
from selftaught.tasks.base import Example

_BLOCK = re.compile(
    r"<!-- selftaught:(skill|memory)((?: \w+=[^\s>]+)*) -->\n(?:.*?\n)?<!-- /selftaught:\1 -->\n*",
    re.DOTALL,
)
_TURNS = re.compile(r" turns=(\d+)")
_OPEN = "<!-- selftaught:"
# anything a reader of the block could take for one of its markers (spacing and case vary; the
# skill's own `selftaught:demos` block lives inside it and is no boundary)
_MARKER_LIKE = re.compile(r"<!--\s*/?\s*selftaught\s*:\s*(?:skill|memory)\b", re.IGNORECASE)
_LIVE_MARKER = re.compile(r"<!-- (/?)selftaught:(skill|memory)(?: \w+=[^\s>]+)* -->")
_WELL_FORMED = (  # (closing, kind) of the marker lines a live file's block may have
    [(False, "skill"), (True, "skill")],
    [(False, "memory"), (True, "memory")],
    [(False, "skill"), (True, "skill"), (False, "memory"), (True, "memory")],
)


class BlockMarkerError(InputError):
    """Text that holds a selftaught block marker where none may be, or a live file whose
    block is not well formed; the message names where."""


def find_marker(text: str) -> str | None:
    """The first thing in `text` that reads as a selftaught block marker, or None."""
    m = _MARKER_LIKE.search(text)
    return None if m is None else text[m.start() : m.start() + 40].split("\n")[0]


def check_no_markers(text: str, where: str) -> str:
    """`text` unchanged when it holds no block marker; else `BlockMarkerError`."""
    found = find_marker(text)
    if found is not None:
        raise BlockMarkerError(
            f"{where} holds a selftaught block marker ({found!r}), which would end the "
            "injected block early and leave what follows outside it; remove it"
        )
    return text


def live_block_span(text: str, where: str) -> tuple[int, int] | None:
    """[start, end) of the adopted block in a live file's `text` (its first marker line to the
    end of its last, newline included); None when it has none. Raises `BlockMarkerError`
    unless every marker is a line of its own and they are one start and one end per block,
    skill before memory, the two blocks adjacent."""
    lines: list[tuple[int, int, bool, str]] = []  # start, end, closing, kind
    pos = 0
    for number, line in enumerate(text.splitlines(keepends=True), 1):
        body = line.rstrip("\r\n")
        if _MARKER_LIKE.search(body):
            m = _LIVE_MARKER.fullmatch(body)
            if m is None:
                raise BlockMarkerError(
                    f"{where}: line {number} holds a selftaught marker that is not a marker "
                    f"line of its own ({body.strip()[:60]!r}); fix the file by hand, it was "
                    "not changed"
                )
            lines.append((pos, pos + len(line), m.group(1) == "/", m.group(2)))
        pos += len(line)
    if not lines:
        return None
    shape = [(closing, kind) for _, _, closing, kind in lines]
    adjacent = len(lines) < 4 or lines[1][1] == lines[2][0]
    if shape not in _WELL_FORMED or not adjacent:
        found = ", ".join(f"{'end' if c else 'start'} of {k}" for c, k in shape)
        raise BlockMarkerError(
            f"{where} holds selftaught markers out of order or repeated ({found}); expected one "
            "start and one end marker per block, skill then memory, nothing between them: fix "
            "the file by hand, it was not changed"
        )
    return lines[0][0], lines[-1][1]


def _marked(kind: str, text: str, attrs: str) -> str:
    body = f"{text.strip()}\n" if text.strip() else ""
    return f"<!-- selftaught:{kind}{attrs} -->\n{body}<!-- /selftaught:{kind} -->"


def _version(adopted: Adopted) -> str:
    return f" version={adopted.version}" if adopted.version else ""


def adopted_block(adopted: Adopted) -> str:
    """The marked text a live file gets for `adopted` (demos as a worked-examples section;
    "" when nothing is adopted)."""
    parts = []
    skill = split_skill(adopted.skill)
    rules = skill.rules
    if skill.demos:
        section = demo_section(skill.demos)
        rules = f"{rules.strip()}\n\n{section}" if rules.strip() else section
    for kind, text in (("skill", rules), ("memory", adopted.memory)):
        if text.strip():
            parts.append(_marked(kind, text, _version(adopted)))
    return "\n".join(parts)


@dataclass(frozen=True)
class RoutedSkill:
    """The skill the router chose for one request: its name, adopted body and version, and
    what that version also holds: its memory and its LoRA adapter (None: it serves none)."""

    name: str
    skill: str
    version: int
    memory: str = ""
    adapter: Path | None = None


@dataclass
class Rendered:
    """What a request gets: the marked system block, the demo turns after it, the demos."""

    block: str
    turns: list[Message]
    demos: tuple[Demo, ...]


def request_text(messages: list[Any]) -> str:
    """The user text of a request (text parts of multi-part contents), the retrieval query."""
    out = []
    for m in messages:
        if not isinstance(m, dict) or m.get("role") != "user":
            continue
        content = m.get("content")
        if isinstance(content, str):
            out.append(content)
        elif isinstance(content, list):
            out += [str(p.get("text", "")) for p in content if isinstance(p, dict)]
    return "\n".join(out)


def _render_skill(messages: list[Any], skill: str, attrs: str) -> Rendered:
    policy = Policy(skill=skill)
    demos = policy.demos_for(Example("request", request_text(messages)))
    turns = policy.demo_messages("", demos)
    rules = policy.system_prompt(demos)  # rules, and the demos placed in the system prompt
    attrs += f" turns={len(turns)}" if turns else ""
    block = _marked("skill", rules, attrs) if rules.strip() or turns else ""
    return Rendered(block, turns, demos)


def render_adopted(
    messages: list[Any], adopted: Adopted, routed: RoutedSkill | None = None
) -> Rendered:
    """The adopted skill and memory for this request, as `Policy` renders them, then the
    routed skill (if any)."""
    own = _render_skill(messages, adopted.skill, _version(adopted))
    parts = [own.block] if own.block else []
    if adopted.memory.strip():
        parts.append(_marked("memory", adopted.memory, _version(adopted)))
    turns, demos = list(own.turns), own.demos
    if routed is not None:
        attrs = f" name={routed.name} version={routed.version}"
        more = _render_skill(messages, routed.skill, attrs)
        parts += [more.block] if more.block else []
        if routed.memory.strip():
            parts.append(_marked("memory", routed.memory, attrs))
        turns += more.turns
        demos += more.demos
    return Rendered("\n".join(parts), turns, demos)


def inject_adopted(messages: Any, adopted: Adopted, routed: RoutedSkill | None = None) -> Any:
    """A copy of `messages` with the adopted skill and memory (and the routed skill) in it
    (see the module doc); `messages` itself unchanged (and returned as is when nothing is
    adopted or it is not a chat list). Raises `RetrievalUnavailable` for a retrieval pool
    without bm25s."""
    if (adopted.empty and routed is None) or not isinstance(messages, list):
        return messages
    rendered = render_adopted(messages, adopted, routed)
    if not rendered.block:
        return messages
    block = rendered.block
    out = list(messages)
    first = out[0] if out else None
    if isinstance(first, dict) and first.get("role") in ("system", "developer"):
        first = copy.copy(first)
        content = first.get("content")
        if isinstance(content, list):
            first["content"] = [{"type": "text", "text": block + "\n\n"}, *content]
        elif isinstance(content, str) and content:
            first["content"] = f"{block}\n\n{content}"
        else:
            first["content"] = block
        out[0] = first
    else:
        out.insert(0, {"role": "system", "content": block})
    out[1:1] = rendered.turns
    return out


def strip_injected(text: str) -> str:
    """`text` without any injected skill or memory block."""
    return _BLOCK.sub("", text)


def _injected_turns(text: str) -> int:
    """How many demo turns the injected skill blocks in `text` (the project's and a routed
    one) say follow them."""
    count = 0
    for m in _BLOCK.finditer(text):
        if m.group(1) == "skill":
            turns = _TURNS.search(m.group(2))
            count += int(turns.group(1)) if turns else 0
    return count


def _strip_content(content: Any) -> tuple[Any, int] | None:
    """(the content without the injected block, demo turns that followed it), or None when
    it holds no block. A multi-part content's block is its first text part."""
    if isinstance(content, str):
        return (strip_injected(content), _injected_turns(content)) if _OPEN in content else None
    if isinstance(content, list) and content and isinstance(content[0], dict):
        text = str(content[0].get("text", ""))
        if _OPEN not in text:
            return None
        stripped = strip_injected(text)
        rest = content[1:] if not stripped else [{**content[0], "text": stripped}, *content[1:]]
        return rest, _injected_turns(text)
    return None


def strip_injected_messages(messages: list[Message]) -> list[Message]:
    """Messages as the client wrote them: blocks removed, the demo turns injected after them
    dropped, an injected-only system message dropped."""
    out: list[Message] = []
    skip = 0
    for msg in messages:
        if skip:
            skip -= 1
            continue
        found = _strip_content(msg.get("content"))
        if found is not None:
            content, skip = found
            if not content and msg.get("role") == "system":
                continue
            msg = {**msg, "content": content}
        out.append(msg)
    return out
