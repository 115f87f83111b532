"""Routing a request by its kind (issue 62): on the stream benchmark's traffic, does the proxy
send each request to its own kind, and a request of no known kind to none?

No model runs. The five nights of `bench_stream.py`'s drift table (its four kinds, their
stream items, 16 requests a night) go through the nights' kind finding alone
(`sleep.night.kinds.find_kinds`, kinds.json carried from night to night); then each kind's
held-out items (its generator's test split, never in the stream) and requests of other
reasoning-gym generators (kinds no night saw, several sharing words with the stream's: "words",
"letter", "numbers", "arithmetic") are routed as the proxy routes them (`KindIndex.kind_of`
over the kinds after night 5). A kind's **own** kind is the one the nights gave most of its
stream requests. Beside it, the router before kinds routed: BM25 over each kind's skill card
(its description and its stream requests, as a night stages them), every kind's skill adopted,
any shared word enough.

Per seed and kind: how many held-out requests went to the kind's own kind, to another kind,
to none; per other generator, how many went to some kind (each such request would be served
that kind's skill); each by kinds and by cards. Dev seeds only (the stream's `dev_seeds`):
nothing here is tuned on a report seed.

    python benchmarks/bench_kind_routing.py                  # seeds 0 1 2
    python benchmarks/bench_kind_routing.py --seeds 0 --heldout 10

**Mined sparsely** (`mined` in the results): a night mines a task only from a request whose
conversation gave a signal, so a night's tasks are a sample of its traffic, a few of a kind.
Per seed and share `p` (each request mined with probability p, seeded), the five nights' kind
finding on what was mined: how many tasks ended in a kind whose tasks are mostly another
stream kind's, or in a kind other than their own kind's (the kind most of their stream kind's
tasks went to) — both wrong — and how many waited with no kind (the safe side).

Results: benchmarks/results/kind_routing.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

import common  # noqa: E402
from bench_stream import KIND_NAMES, SCHEDULE, kind_items  # noqa: E402

OTHERS = (  # reasoning-gym generators none of the stream's kinds is
    "word_sorting",
    "caesar_cipher",
    "count_primes",
    "letter_jumble",
    "spell_backward",
    "gcd",
    "chain_sum",
    "simple_equations",
    "number_sorting",
    "base_conversion",
)


def nights_of(stream: dict[str, Any], mined: Callable[[], bool]) -> Iterator[tuple[int, list[Any]]]:
    """The drift table's nights, each with its requests as tasks (`MinedTask`), each request
    kept when `mined()` says so (asked once per request, in stream order)."""
    from selftaught.sleep.night.mine import MinedTask

    used: Counter[str] = Counter()
    for night, counts in enumerate(SCHEDULE, 1):
        tasks = []
        for kind, n in counts.items():
            for r in stream[kind][used[kind] : used[kind] + n]:
                if mined():
                    tasks.append(MinedTask(r.id, [{"role": "user", "content": r.question}]))
            used[kind] += n
        yield night, tasks


def stream_kinds(seed: int, per_kind: int) -> tuple[Any, dict[str, str], dict[str, Any], list[Any]]:
    """(the kinds after the five nights, each stream kind's own kind id, its held-out items,
    each kind's card as a night stages it: its stream requests)."""
    from selftaught.sleep.night.kinds import KindConfig, find_kinds

    stream, heldout = {}, {}
    for kind in KIND_NAMES:
        stream[kind], heldout[kind] = kind_items(kind, seed, 60, per_kind)
    known: tuple[Any, ...] = ()
    given: Counter[tuple[str, str | None]] = Counter()
    tasks_of: dict[str, list[str]] = {}
    for night, tasks in nights_of(stream, lambda: True):
        found = find_kinds(tasks, known, KindConfig(), f"night{night}")
        given.update((t.id.split("-")[0], t.kind) for t in tasks)
        for t in tasks:
            tasks_of.setdefault(str(t.kind), []).append(t.prompt)
        known = found.kinds
    own = {}
    for kind in KIND_NAMES:
        ranked = sorted(((n, k) for (s, k), n in given.items() if s == kind and k), reverse=True)
        own[kind] = ranked[0][1]
    return known, own, heldout, cards(known, tasks_of)


MINED_SHARES = (0.25, 0.4, 0.7, 1.0)


def mined_sparsely(seed: int, share: float) -> dict[str, int]:
    """Kinds found on nights that mined each request with probability `share` (module
    docstring): tasks, wrong (in another kind's kind, or off their own), waiting (no kind)."""
    import random

    from selftaught.sleep.night.kinds import KindConfig, find_kinds

    rng = random.Random(seed)
    stream = {kind: kind_items(kind, seed, 60, 1)[0] for kind in KIND_NAMES}
    known: tuple[Any, ...] = ()
    given: Counter[tuple[str, str | None]] = Counter()
    for night, tasks in nights_of(stream, lambda: rng.random() < share):
        if tasks:
            known = find_kinds(tasks, known, KindConfig(), f"night{night}").kinds
            given.update((t.id.split("-")[0], t.kind) for t in tasks)
    by_kind: dict[str, Counter[str]] = {}
    for (source, kid), n in given.items():
        if kid is not None:
            by_kind.setdefault(kid, Counter())[source] += n
    mixed = sum(sum(c.values()) - max(c.values()) for c in by_kind.values())
    own = {s: max(((n, k) for (t, k), n in given.items() if t == s and k), default=(0, None))[1]
           for s in KIND_NAMES}  # fmt: skip
    off_own = sum(n for (s, k), n in given.items() if k is not None and k != own[s])
    waiting = sum(n for (_, k), n in given.items() if k is None)
    return {"tasks": sum(given.values()), "wrong": mixed + off_own, "waiting": waiting}


def cards(known: Sequence[Any], tasks_of: dict[str, list[str]]) -> list[Any]:
    from selftaught.skill.routing import SkillCard
    from selftaught.skill.skillset import fallback_name

    return [SkillCard(k.id, fallback_name(k.terms)[1], tuple(tasks_of.get(k.id, ())[:40]))
            for k in known]  # fmt: skip


def run_seed(seed: int, per_kind: int, others: int) -> dict[str, Any]:
    from selftaught.skill.routing import SkillRouter
    from selftaught.sleep.kinds_file import index_of
    from selftaught.sleep.night.kinds import KindConfig
    from selftaught.tasks import load_task

    known, own, heldout, staged = stream_kinds(seed, per_kind)
    index = index_of(known, KindConfig().similarity)
    by_card = SkillRouter(staged)
    routers = {"kinds": index.kind_of, "cards": lambda text: by_card.route(text).skill}
    out: dict[str, Any] = {"seed": seed, "kinds_found": [k.id for k in known]}
    for name, route in routers.items():
        kinds = {}
        for kind, items in heldout.items():
            went: Counter[str] = Counter()
            for r in items:
                got = route(r.question)
                went["own" if got == own[kind] else "none" if got is None else "other"] += 1
            kinds[kind] = {"own_kind": own[kind], **{k: went[k] for k in ("own", "other", "none")}}
        foreign = {}
        for gen in OTHERS:
            task = load_task(
                f"gym:{gen}", train_size=others, val_size=0, test_size=0, seed=seed + 7
            )
            claimed = [route(str(ex.input)) for ex in task.examples("train")]
            foreign[gen] = {"n": len(claimed), "routed": sum(k is not None for k in claimed)}
        out[name] = {"kinds": kinds, "others": foreign}
    return out


def table(rows: Sequence[dict[str, Any]]) -> str:
    """Per seed and router: each kind's held-out requests routed to its own kind (and to
    another), and the other generators' requests routed to some kind."""
    head = "| seed | kinds found | router | " + " | ".join(KIND_NAMES) + " | other generators |"
    lines = [head, "|---" * (len(KIND_NAMES) + 4) + "|"]
    for row in rows:
        for router in ("kinds", "cards"):
            got = row[router]
            cells = [f"{k['own']}/{k['own'] + k['other'] + k['none']} ({k['other']} other)"
                     for k in (got["kinds"][name] for name in KIND_NAMES)]  # fmt: skip
            routed = sum(o["routed"] for o in got["others"].values())
            total = sum(o["n"] for o in got["others"].values())
            lines.append(f"| {row['seed']} | {len(row['kinds_found'])} | {router} | "
                         + " | ".join(cells) + f" | {routed}/{total} routed |")  # fmt: skip
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> Path:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--heldout", type=int, default=40, help="held-out requests per kind")
    p.add_argument("--others", type=int, default=10, help="requests per other generator")
    args = p.parse_args(argv)
    rows = [run_seed(seed, args.heldout, args.others) for seed in args.seeds]
    mined = {str(share): [mined_sparsely(seed, share) for seed in args.seeds]
             for share in MINED_SHARES}  # fmt: skip
    out = common.RESULTS / "kind_routing.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"machine": common.machine_info(), "command": common.command_line(),
              "settings": vars(args), "rows": rows, "mined": mined}  # fmt: skip
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(table(rows))
    for share, runs in mined.items():
        tot = {k: sum(r[k] for r in runs) for k in ("tasks", "wrong", "waiting")}
        print(f"mined {share}: {tot['wrong']} of {tot['tasks']} tasks in a wrong kind, "
              f"{tot['waiting']} waiting with none")  # fmt: skip
    print(f"wrote {out}")
    return out


if __name__ == "__main__":
    main()
