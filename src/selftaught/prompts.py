"""The prompt templates every model call is asked through, and the user's overrides.

The packaged templates are `.md` files in three folders: the analyst's (`skill/prompts/`:
reflect, merge, repair, teacher, summary, names, dreams), the judge's (`tasks/prompts/`) and
the night's readers' (`sleep/night/prompts/`: miner, follow-up). A prompt's name is its file
name without `.md`, one name space over the three.

`--prompts DIR` (`SkillOptConfig.prompts`) overrides them by file name: `DIR/merge.md`
replaces the packaged `merge.md`, the others stay. A file of an unknown name is refused,
listing the valid ones; a template that lacks a placeholder the packaged one fills is refused,
naming it (the model would not see what it is asked about). A run records the digest of each
override (`PromptSet.digests`), so a resumed run whose prompts changed is refused.

    with using(PromptSet.read("my-prompts")):
        text = load("merge")        # my-prompts/merge.md
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from selftaught.errors import ConfigError, read_text

_HERE = Path(__file__).parent
FOLDERS = (
    _HERE / "skill" / "prompts",
    _HERE / "tasks" / "prompts",
    _HERE / "sleep" / "night" / "prompts",
)
# placeholders a template may leave out: the document's name and the counts it is told
OPTIONAL = frozenset({"DOC", "doc", "doc_description", "max_edits", "min", "n"})
_PLACEHOLDER = re.compile(r"\{\{([A-Za-z_]+)\}\}")


def packaged_paths() -> dict[str, Path]:
    """Every packaged template by name."""
    return {p.stem: p for folder in FOLDERS for p in sorted(folder.glob("*.md"))}


def packaged(name: str) -> str:
    """The packaged template `name` (a KeyError names an unknown one: a bug)."""
    return packaged_paths()[name].read_text("utf-8")


def required(name: str) -> list[str]:
    """The placeholders an override of `name` must hold: every one the packaged template
    fills but the document's name and the counts (`OPTIONAL`)."""
    found = dict.fromkeys(_PLACEHOLDER.findall(packaged(name)))
    return [p for p in found if p not in OPTIONAL]


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class PromptSet:
    """The user's overrides (name → template text) and the folder they came from; empty:
    the packaged prompts alone."""

    folder: str | None = None
    overrides: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def read(cls, folder: str | Path | None) -> PromptSet:
        """The overrides in `folder` (its `.md` files), checked: an unknown name or a missing
        placeholder is a `ConfigError` naming it. None: no override."""
        if folder is None:
            return cls()
        root = Path(folder)
        if not root.is_dir():
            raise ConfigError(f"--prompts {root} is not a folder")
        known = packaged_paths()
        texts: dict[str, str] = {}
        for path in sorted(root.glob("*.md")):
            if path.stem not in known:
                raise ConfigError(
                    f"--prompts: {path.name} is no prompt's name; the prompts are "
                    f"{', '.join(n + '.md' for n in sorted(known))}"
                )
            text = read_text(path, "prompt template")
            missing = [p for p in required(path.stem) if "{{" + p + "}}" not in text]
            if missing:
                raise ConfigError(
                    f"--prompts: {path.name} lacks {', '.join('{{' + p + '}}' for p in missing)}"
                    " (the packaged template fills it: the model would not see it)"
                )
            texts[path.stem] = text
        return cls(str(root), MappingProxyType(texts))

    def text(self, name: str) -> str:
        """The template `name`: the override, else the packaged one."""
        return self.overrides[name] if name in self.overrides else packaged(name)

    def digests(self) -> dict[str, str]:
        """Each override's digest by name (what a resumed run must match; {} without any)."""
        return {name: digest(text) for name, text in sorted(self.overrides.items())}


_ACTIVE = PromptSet()


def active() -> PromptSet:
    """The prompt set every `load` reads now (the packaged prompts unless `using` one)."""
    return _ACTIVE


def load(name: str) -> str:
    """The template `name` as the active set has it."""
    return _ACTIVE.text(name)


@contextlib.contextmanager
def using(prompts: PromptSet) -> Iterator[PromptSet]:
    """Every `load` reads `prompts` inside (a run, a night), in every thread; the set before
    comes back after."""
    global _ACTIVE
    before, _ACTIVE = _ACTIVE, prompts
    try:
        yield prompts
    finally:
        _ACTIVE = before
