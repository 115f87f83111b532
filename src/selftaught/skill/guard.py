"""Guard: refuse analyst edits that no user would keep in a skill. Pure.

A skill holds general rules. Measured on the peer set-up (Qwen2.5-Coder-0.5B as target and
analyst), `optimize` once shipped the seed prompt plus "Calculate ( | -38 * -13 - 69 | )" (a
mangled train question that slipped past a verbatim filter) and "To improve the SKILL: the
instructions an AI assistant reads before it solves tasks ..." (the analyst's own prompt
echoed back), accepted on +2 of 30 val items. Two fuzzy checks make that impossible:

- **prompt echo**: the edit shares a long word n-gram with the analyst's prompt templates, or
  most of its shorter n-grams;
- **example content**: the edit carries the number sequence of a train or val input (three
  numbers in a row, or two that make four digits or more), or nearly all of its words come
  from one input.

Both look at train AND val inputs: an edit that copies a val question would also leak the
gate's own data into the skill.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from selftaught.skill.document import Edit
from selftaught.text import ngrams, numbers, words

_PLACEHOLDER = re.compile(r"\{\{\w+\}\}")
# Words that say nothing about where a text came from.
_STOPWORDS = frozenset(
    ("a", "an", "and", "are", "as", "at", "be", "by", "for", "from", "if", "in", "into")
    + ("is", "it", "its", "of", "on", "or", "so", "that", "the", "then", "this", "to")
    + ("was", "what", "when", "which", "with", "you", "your")
)


@dataclass(frozen=True)
class GuardConfig:
    echo_long_ngram: int = 8
    """Any shared word n-gram of this length with a prompt template is an echo."""
    echo_short_ngram: int = 4
    echo_share: float = 0.5
    """...or this share of the edit's shorter n-grams found in the templates."""
    min_numbers: int = 3
    """A run of this many numbers in a row, as in one input, is that input's content..."""
    min_digits: int = 4
    """...as is a run of two numbers with at least this many digits together."""
    word_share: float = 0.8
    """An edit whose content words come from one input at this share is a copy of it..."""
    min_words: int = 5
    """...when it has at least this many content words."""


class EditGuard:
    """Checks edits against the analyst's prompt templates and the task's train/val inputs."""

    def __init__(
        self,
        templates: Iterable[str],
        inputs: Iterable[str],
        config: GuardConfig | None = None,
    ):
        self.config = cfg = config or GuardConfig()
        template_words = [words(_PLACEHOLDER.sub(" ", t)) for t in templates]
        self._long = set().union(*(ngrams(w, cfg.echo_long_ngram) for w in template_words))
        self._short = set().union(*(ngrams(w, cfg.echo_short_ngram) for w in template_words))
        self._inputs = [(numbers(text), set(words(text))) for text in inputs]

    def check(self, edit: Edit) -> str | None:
        """Why the edit must not enter a skill, or None when it may."""
        if not edit.content.strip():
            return None  # a delete adds nothing
        return self._echo(edit.content) or self._example_content(edit.content)

    def split(self, edits: list[Edit]) -> tuple[list[Edit], list[dict[str, object]]]:
        """(kept edits, refused ones with their reason), in the invalid-edit format."""
        kept: list[Edit] = []
        refused: list[dict[str, object]] = []
        for edit in edits:
            reason = self.check(edit)
            if reason is None:
                kept.append(edit)
            else:
                refused.append({"edit": edit.to_dict(), "reason": reason})
        return kept, refused

    def _echo(self, content: str) -> str | None:
        cfg = self.config
        tokens = words(content)
        if ngrams(tokens, cfg.echo_long_ngram) & self._long:
            return "echoes the analyst's prompt"
        short = ngrams(tokens, cfg.echo_short_ngram)
        if short and len(short & self._short) / len(short) >= cfg.echo_share:
            return "echoes the analyst's prompt"
        return None

    def _example_content(self, content: str) -> str | None:
        cfg = self.config
        nums = numbers(content)
        content_words = {w for w in words(content) if w not in _STOPWORDS and not w.isdigit()}
        for input_numbers, input_words in self._inputs:
            if _shares_number_run(nums, input_numbers, cfg.min_numbers, cfg.min_digits):
                return "carries an example's numbers (a skill holds rules, not examples)"
            if len(content_words) >= cfg.min_words:
                share = len(content_words & input_words) / len(content_words)
                if share >= cfg.word_share:
                    return "copies an example's wording (a skill holds rules, not examples)"
        return None


def _shares_number_run(a: list[str], b: list[str], min_numbers: int, min_digits: int) -> bool:
    """True when `a` and `b` share a contiguous run of numbers that is long enough: at least
    `min_numbers` numbers, or two whose digits add up to `min_digits`."""
    if len(a) < 2 or len(b) < 2:
        return False
    positions: dict[str, list[int]] = {}
    for j, x in enumerate(b):
        positions.setdefault(x, []).append(j)
    for i in range(len(a)):
        for j in positions.get(a[i], []):
            k = 0
            while i + k < len(a) and j + k < len(b) and a[i + k] == b[j + k]:
                k += 1
                run = a[i : i + k]
                digits = sum(len(x.replace(".", "")) for x in run)
                if k >= min_numbers or (k >= 2 and digits >= min_digits):
                    return True
    return False
