"""The SKILL.md format every agent reads: a front matter of name and description, then text.

Claude Code (`.claude/skills/<name>/SKILL.md`) and Codex (its skills folders) read the same
shape: a YAML front matter between `---` lines with `name`
and `description`, then the skill's body in Markdown. A file selftaught writes holds those
two keys only: never `allowed-tools`, hooks or anything else that grants the agent more than
text. A user's own file may hold more; `parse_skill_md` keeps its other front-matter lines
verbatim (`extra`) so an edit of the body leaves them as the user wrote them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from selftaught.errors import InputError
from selftaught.skill.routing import SkillCard

FENCE = "---"


class SkillFileError(InputError):
    """A SKILL.md that cannot be read: no front matter, or no name / description."""


@dataclass(frozen=True)
class SkillFile:
    """One parsed SKILL.md: its card (name, description), its body, and any other front
    matter lines the user wrote (kept verbatim, never added by selftaught)."""

    card: SkillCard
    body: str
    extra: tuple[str, ...] = ()

    def render(self) -> str:
        return render_skill_md(self.card, self.body, extra=self.extra)


def render_skill_md(card: SkillCard, body: str, extra: tuple[str, ...] = ()) -> str:
    """The file's text. Values are JSON-quoted, which YAML reads as the same string."""
    head = [FENCE, f"name: {card.name}", f"description: {json.dumps(card.description)}"]
    return "\n".join([*head, *extra, FENCE, ""]) + body.strip("\n") + "\n"


def _value(raw: str) -> str:
    raw = raw.strip()
    if raw.startswith('"'):
        try:
            return str(json.loads(raw))
        except json.JSONDecodeError:
            return raw.strip('"')
    if raw.startswith("'") and raw.endswith("'") and len(raw) >= 2:
        return raw[1:-1].replace("''", "'")
    return raw


def parse_skill_md(text: str, where: str) -> SkillFile:
    """Read a SKILL.md; `where` names it in errors."""
    lines = text.split("\n")
    if not lines or lines[0].strip() != FENCE:
        raise SkillFileError(f"{where}: a SKILL.md starts with a '---' front matter line")
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].strip() == FENCE)
    except StopIteration:
        raise SkillFileError(f"{where}: the front matter is not closed by a '---' line") from None
    keys: dict[str, str] = {}
    extra: list[str] = []
    for line in lines[1:end]:
        key, sep, raw = line.partition(":")
        if sep and key.strip() in {"name", "description"} and not line.startswith((" ", "\t")):
            keys[key.strip()] = _value(raw)
        else:
            extra.append(line)
    for key in ("name", "description"):
        if not keys.get(key):
            raise SkillFileError(f"{where}: the front matter has no {key!r}")
    card = SkillCard(keys["name"], keys["description"])
    body = "\n".join(lines[end + 1 :]).strip("\n")
    return SkillFile(card=card, body=body, extra=tuple(extra))
