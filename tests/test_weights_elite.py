"""Elite selection: threshold, top fraction per prompt, dedupe, cap per prompt, truncation."""

from __future__ import annotations

import pytest

from selftaught.weights.elite import select_elite
from selftaught.weights.sampling import Sample


def s(eid: str, text: str, score: float, *, truncated: bool = False) -> Sample:
    msgs = [{"role": "user", "content": f"question {eid}"}]
    return Sample(eid, msgs, msgs, text, text, score, float(score >= 1.0), truncated)


def test_threshold_keeps_only_solved_and_prompt_is_kept():
    samples = [s("a", "2", 1.0), s("a", "3", 0.0), s("b", "5", 0.5), s("b", "4", 1.0)]
    kept, stats = select_elite(samples, min_score=1.0)
    assert [(k.example_id, k.target) for k in kept] == [("a", "2"), ("b", "4")]
    assert kept[0].messages == [{"role": "user", "content": "question a"}]
    assert stats.below_threshold == 2 and stats.kept == 2 and stats.prompts_kept == 2


def test_dedupe_normalises_whitespace_and_cap_per_prompt():
    samples = [
        s("a", "x = 2", 1.0),
        s("a", "x  =  2", 1.0),
        s("a", "it is 2", 1.0),
        s("a", "2", 1.0),
        s("b", "7", 1.0),
    ]
    kept, stats = select_elite(samples, min_score=1.0, max_per_prompt=2)
    by_prompt = [k.target for k in kept if k.example_id == "a"]
    assert len(by_prompt) == 2
    assert len({" ".join(t.split()) for t in by_prompt}) == 2  # no duplicate survives
    assert stats.duplicates == 1 and stats.over_cap == 1
    # shorter replies first among equal scores
    assert by_prompt[0] == "2"


def test_top_fraction_per_prompt_without_threshold():
    samples = [s("g", f"s{i}", i / 10) for i in range(8)] + [s("h", "only", 0.1)]
    kept, _ = select_elite(samples, min_score=None, elite_fraction=0.25)
    assert [k.target for k in kept if k.example_id == "g"] == ["s7", "s6"]
    assert [k.target for k in kept if k.example_id == "h"] == ["only"]  # ceil keeps one


def test_truncated_replies_are_dropped_unless_asked():
    samples = [s("a", "The answer is", 1.0, truncated=True), s("a", "4", 1.0)]
    kept, stats = select_elite(samples, min_score=1.0)
    assert [k.target for k in kept] == ["4"]
    kept, _ = select_elite(samples, min_score=1.0, keep_truncated=True)
    assert len(kept) == 2


def test_nothing_solved_keeps_nothing_and_bad_fraction_fails():
    kept, stats = select_elite([s("a", "1", 0.0), s("b", "2", 0.2)], min_score=1.0)
    assert kept == [] and stats.prompts_kept == 0
    with pytest.raises(ValueError, match="elite_fraction"):
        select_elite([], elite_fraction=0.0)
