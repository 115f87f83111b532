"""Every measured table and figure in README.md, the docs pages (docs/*.md) and
benchmarks/README.md, written from the results files in benchmarks/results/, so that no number
in them is typed by hand.

- A table sits between `<!-- table:NAME -->` and `<!-- /table:NAME -->`; NAME is one of
  `TABLES` below, each a function of the results folder.
- A figure quoted in prose is a span `<!-- fig:FILE#PATH|FORMAT -->TEXT<!-- /fig -->`: FILE a
  results file, PATH a dotted path into its JSON (list items by index), FORMAT a Python format
  spec (`.3f`, `d`, `+.2f`); a list value is written `a–b` (an interval).

    python benchmarks/tables.py           # rewrite every marked block from the files
    python benchmarks/tables.py --check   # exit 1, naming each block that differs

`tests/test_figures.py` runs the check: a table or figure edited by hand, or a results file
changed without regenerating the text, fails the tests.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from common import BENCH_DIR, REPO, RESULTS, fmt_acc

DOCS = (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), BENCH_DIR / "README.md")

TABLE = re.compile(r"(<!-- table:([\w-]+) -->\n)(.*?)(\n<!-- /table:\2 -->)", re.S)
# a span is one line: a marker quoted in prose never reaches a later span's end
FIG = re.compile(r"(<!-- fig:([^#\s]+)#([\w.\-]+)\|([^ ]*) -->)(.*?)(<!-- /fig -->)")


def _load(results: Path, name: str) -> Any:
    return json.loads((results / name).read_text(encoding="utf-8"))


# ---- tables whose renderer lives in the benchmark that measures them -------------------


def peers_report(results: Path) -> str:
    import bench_peers

    return bench_peers.saved_report_tables(results)


def followups_dev(results: Path) -> str:
    import bench_followups

    return bench_followups.dev_table(results)


def peers_report_status(results: Path) -> str:
    import bench_peers

    return bench_peers.report_status_table(results)


def peers_report2(results: Path) -> str:
    import bench_peers

    return bench_peers.saved_report_tables(results, round_=2)


def peers_report2_status(results: Path) -> str:
    import bench_peers

    return bench_peers.report_status_table(results, round_=2)


def peers_dev(results: Path) -> str:
    import bench_peers

    return bench_peers.saved_peers_report(results).strip()


def gate_sweep(results: Path) -> str:
    import bench_peers

    path = results / "gate_sweep.json"
    if not path.exists():
        return "Not measured yet: run `python benchmarks/bench_peers.py --gate` on a quiet machine."
    saved = _load(results, "gate_sweep.json")
    by_task: dict[str, list[dict[str, Any]]] = {}
    for row in saved["runs"]:
        by_task.setdefault(row["task"], []).append(row)
    return bench_peers.report(saved["settings"], saved["meta"], by_task).strip()


def overhead(results: Path) -> str:
    import bench_overhead

    saved = _load(results, "overhead.json")
    return bench_overhead.report(SimpleNamespace(**saved["settings"]), saved["meta"],
                                 saved["results"])  # fmt: skip


def tool_rest(results: Path) -> str:
    import bench_tool_rest

    return bench_tool_rest.readme_body(_load(results, "tool_rest.json")).strip()


def replay(results: Path) -> str:
    import bench_replay

    return bench_replay._readme(_load(results, "replay.json")).strip()


def dtype_cpu(results: Path) -> str:
    import bench_dtype

    return bench_dtype.readme_body(results)


def gate_sim(results: Path) -> str:
    import bench_gate_sim

    return bench_gate_sim.table(_load(results, "gate_sim.json")["results"])


def gate_power(results: Path) -> str:
    import bench_gate_sim

    return bench_gate_sim.power_table(_load(results, "gate_power.json")["runs"])


# ---- tables rendered here --------------------------------------------------------------


def probation(results: Path) -> str:
    from common import markdown_table

    header = ["version 2", "confidence", "flagged within 1,000 requests",
              "requests until flagged: median", "90th pct", "max"]  # fmt: skip
    body = []
    for label, s in _load(results, "probation.json")["settings"].items():
        cfg = s["setting"]
        body.append(
            [
                f"{label}",
                f"{cfg['confidence']:g}",
                f"{100 * s['flagged_share']:.1f}%",
                f"{s['median']:g}",
                f"{s['p90']:.0f}",
                f"{s['max']}",
            ]
        )
    return markdown_table(header, body)


def _sleep_table(results: Path, name: str) -> str:
    """Held-out hard accuracy per night and config (95% Wilson interval on night 0 and
    wherever a version was adopted), with each night's status and wall time."""
    from common import markdown_table

    configs = _load(results, name)["configs"]
    nights = max(len(c["nights"]) for c in configs.values())
    header = ["config", *[f"night {i}" for i in range(nights)], "wall per night (s)"]
    body = []
    for label, c in configs.items():
        cells = []
        for n in c["nights"]:
            h = n["heldout"]
            lo, hi = h["hard_ci95"]
            acc = f"{h['hard']:.2f}"
            if n["night"] == 0 or n.get("status") == "adopted":
                acc += f" [{lo:.2f}, {hi:.2f}]"
            cells.append(acc if n["night"] == 0 else f"{acc} ({n.get('status')})")
        walls = " / ".join(f"{s:.0f}" for s in c["summary"]["night_s"])
        body.append([label, *cells, *[""] * (nights - len(cells)), walls])
    n = next(iter(configs.values()))["nights"][0]["heldout"]["n"]
    note = (
        f"Held out: {n} requests; the smallest difference a paired test on them can show at "
        f"α = 0.05 (two-sided exact sign test) is {_mdd(n)}."
    )
    return note + "\n\n" + markdown_table(header, body)


def quickstart(results: Path) -> str:
    """The quick start's measured runs: test accuracy before and after, paired."""
    from common import markdown_table

    body = []
    names = ("quickstart_demos_local.json", "quickstart_demos_local_2026-11-28.json",
             "quickstart_demos_local_bf16_2026-11-28.json",
             "quickstart_demos_local_test100.json")  # fmt: skip
    for name in names:
        saved = _load(results, name)
        test = saved["test"]
        i, b, p = test["initial"], test["best"], test["paired"]
        body.append(
            [
                f"`{name}`",
                b["n"],
                f"{i['hard']:.3f} [{i['hard_ci'][0]:.3f}, {i['hard_ci'][1]:.3f}]",
                f"{b['hard']:.3f} [{b['hard_ci'][0]:.3f}, {b['hard_ci'][1]:.3f}]",
                f"{p['wins']} / {p['losses']}",
                _p(p["wins"], p["losses"]),
                f"{_mdd(b['n'])}",
                f"{saved['wall_s']:.0f}",
                f"{raw['tok_per_s']:.1f}" if (raw := saved.get("raw_decode")) else "not measured",
            ]
        )
    header = ["results file", "test items", "test before [95% CI]", "after [95% CI]", "W / L",
              "p (two-sided sign test)", "smallest difference n items can show (α 0.05)",
              "wall s", "raw decode tok/s (batch 8, just before)"]  # fmt: skip
    return markdown_table(header, body)


def stream_report(results: Path) -> str:
    """The stream benchmark's reported runs (issue 62, `bench_stream.py --report`), one block
    per results file: held-out accuracy per configuration, kind and night, retention, and the
    mean gain against the single-kind streams'."""
    files = sorted(p for p in results.glob("stream_report_*.json") if "_single-" not in p.name)
    if not files:
        return (
            "Not measured yet: the reported runs come once `report_settings_stream.json` is "
            "frozen (`python benchmarks/bench_stream.py --report SEED --target TARGET`)."
        )
    return "\n\n".join(_stream_block(results, f.name) for f in files)


def stream_dev(results: Path) -> str:
    """The stream benchmark's dev runs kept as results (`stream_dev_*.json`: dev seeds, settings
    chosen as they ran, for debugging and choosing; never the reported figures)."""
    files = sorted(p for p in results.glob("stream_dev_*.json") if "_single-" not in p.name)
    return "\n\n".join(_stream_block(results, f.name) for f in files) or "No dev run kept."


def _stream_block(results: Path, name: str) -> str:
    from common import markdown_table

    saved = _load(results, name)
    s, kinds = saved["settings"], list(saved["kinds"])
    head = (
        f"**`{name}`**: {s['target']}, deployment `{s['deployment']}`, {s['nights']} nights x "
        f"{s['requests_per_night']} requests, {s['heldout']} held-out items per kind (the "
        f"smallest difference a paired test on them can show at α = 0.05: {_mdd(s['heldout'])})."
    )
    header = ["config", "kind", *[f"night {i}" for i in range(s["nights"] + 1)],
              "final vs best earlier (two-sided sign test)", "forgot"]  # fmt: skip
    rows, summary = [], []
    for label, c in saved["configs"].items():
        if c.get("unavailable"):
            rows.append([label, "", c["unavailable"], *[""] * (len(header) - 3)])
            continue
        for kind in kinds:
            rows.append([label, kind, *_stream_nights(c["nights"], kind, s["nights"]),
                         *_stream_retention(c["summary"]["kinds"][kind]["retention"])])  # fmt: skip
        summary.append(_stream_summary(label, c["summary"]))
    sum_header = ["config", "mean gain over kinds", "kinds forgotten", "wall per night (s)",
                  "calls per night (traffic / night / held-out)"]  # fmt: skip
    parts = [head, markdown_table(header, rows), markdown_table(sum_header, summary)]
    single = _stream_single(results, name, saved)
    return "\n\n".join(parts + ([single] if single else []))


def _stream_nights(nights: list[dict[str, Any]], kind: str, planned: int) -> list[str]:
    """Each night's accuracy; night 0's and the last's with their 95% interval."""
    cells = []
    for i, n in enumerate(nights):
        acc = n["heldout"]["kinds"][kind]
        cells.append(fmt_acc(acc) if i in (0, len(nights) - 1) else f"{acc['hard']:.2f}")
    return cells + [""] * (planned + 1 - len(cells))


def _stream_retention(r: dict[str, Any] | None) -> list[str]:
    if r is None:
        return ["", ""]
    p = _p(r["wins"], r["losses"])
    said = (f"{r['final']:.2f} vs {r['best']:.2f} (night {r['best_night']}): "
            f"{r['wins']} W / {r['losses']} L, p {p}")  # fmt: skip
    return [said, "**yes**" if r["forgot"] else "no"]


def _stream_summary(label: str, summary: dict[str, Any]) -> list[str]:
    calls = " · ".join(f"{c['traffic']}/{c['night']}/{c['heldout']}" for c in summary["calls"])
    return [
        label,
        f"{summary['mean_gain']:+.3f}",
        ", ".join(summary["forgotten"]) or "none",
        " / ".join(f"{w:.0f}" for w in summary["wall_s"]),
        calls,
    ]


def _stream_single(results: Path, name: str, saved: dict[str, Any]) -> str:
    """Each configuration's mean gain on the mixed stream against its gains on single-kind
    streams of the same size (the files `bench_stream.py --single-kind KIND` wrote)."""
    lines = []
    for label, c in saved["configs"].items():
        gains = {}
        for kind in saved["kinds"]:
            other = results / name.replace("_seed", f"_single-{kind}_seed")
            single = _load(results, other.name)["configs"].get(label) if other.exists() else None
            if single and single.get("summary"):
                gains[kind] = single["summary"]["kinds"][kind]["gain"]
        if not gains or "summary" not in c:
            continue
        mean = sum(gains.values()) / len(gains)
        mixed = c["summary"]["mean_gain"]
        ratio = f"{mixed / mean:.2f}" if mean > 0 else "undefined (no single-kind gain)"
        each = ", ".join(f"{k} {g:+.3f}" for k, g in gains.items())
        lines.append(f"- `{label}`: mixed stream mean gain {mixed:+.3f}; single-kind streams "
                     f"{each} (mean {mean:+.3f}); ratio {ratio} (target ≥ 0.8)")  # fmt: skip
    return "\n".join(lines)


def _p(wins: int, losses: int) -> str:
    from selftaught.stats import sign_test_two_sided

    p = sign_test_two_sided(wins, losses)
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def _mdd(n: int) -> str:
    from selftaught.stats import min_detectable_difference

    mdd = min_detectable_difference(n)
    return "none" if mdd is None else f"{mdd:.3f}"


TABLES: dict[str, Callable[[Path], str]] = {
    "peers_report": peers_report,
    "peers_report_status": peers_report_status,
    "peers_report2": peers_report2,
    "peers_report2_status": peers_report2_status,
    "peers_dev": peers_dev,
    "gate_sweep": gate_sweep,
    "gate_sim": gate_sim,
    "gate_power": gate_power,
    "dtype_cpu": dtype_cpu,
    "overhead": overhead,
    "tool_rest": tool_rest,
    "replay": replay,
    "probation": probation,
    "sleep_default": lambda r: _sleep_table(r, "sleep_local.json"),
    "sleep_addition": lambda r: _sleep_table(r, "sleep_local_addition.json"),
    "sleep_qwen": lambda r: _sleep_table(r, "sleep_qwen.json"),
    "quickstart": quickstart,
    "stream_report": stream_report,
    "stream_dev": stream_dev,
    "followups_dev": followups_dev,
}


# ---- figures in prose ------------------------------------------------------------------


def figure(results: Path, file: str, path: str, fmt: str) -> str:
    """The value at `path` in `results/file`, formatted."""
    value: Any = _load(results, file)
    for key in path.split("."):
        value = value[int(key)] if isinstance(value, list) else value[key]
    if isinstance(value, list):
        return "–".join(format(v, fmt) for v in value)
    return format(value, fmt)


# ---- documents -------------------------------------------------------------------------


def render(text: str, results: Path = RESULTS) -> str:
    """`text` with every marked table and figure regenerated from `results`."""
    sys.path.insert(0, str(BENCH_DIR))

    def table(m: re.Match[str]) -> str:
        name = m.group(2)
        if name not in TABLES:
            raise SystemExit(f"<!-- table:{name} -->: no such table; known: {', '.join(TABLES)}")
        return m.group(1) + TABLES[name](results).strip() + m.group(4)

    def fig(m: re.Match[str]) -> str:
        return m.group(1) + figure(results, m.group(2), m.group(3), m.group(4)) + m.group(6)

    return FIG.sub(fig, TABLE.sub(table, text))


def differences(text: str, results: Path = RESULTS) -> list[str]:
    """The marked blocks of `text` that differ from what the files give (their names)."""
    fresh = render(text, results)
    if fresh == text:
        return []
    old = {m.group(2): m.group(3) for m in TABLE.finditer(text)}
    new = {m.group(2): m.group(3) for m in TABLE.finditer(fresh)}
    names = [f"table:{k}" for k in old if old[k] != new.get(k)]
    old_figs = [(m.group(1), m.group(5)) for m in FIG.finditer(text)]
    new_figs = [(m.group(1), m.group(5)) for m in FIG.finditer(fresh)]
    names += [f"{a[0]} says {a[1]!r}, the file {b[1]!r}" for a, b in
              zip(old_figs, new_figs, strict=True) if a != b]  # fmt: skip
    return names


def main(argv: list[str] | None = None) -> None:
    from selftaught.runs import atomic_write_text

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when a block differs")
    args = ap.parse_args(argv)
    stale = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        if args.check:
            stale += [f"{doc.relative_to(REPO)}: {d}" for d in differences(text)]
            continue
        fresh = render(text)
        if fresh != text:
            atomic_write_text(doc, fresh)
            print(f"rewrote {doc.relative_to(REPO)}")
    if stale:
        raise SystemExit("stale (run python benchmarks/tables.py):\n" + "\n".join(stale))


if __name__ == "__main__":
    main()
