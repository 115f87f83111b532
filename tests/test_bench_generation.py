"""benchmarks/bench_generation.py --engine-arms, its pure parts: the arms' engine settings, the
interleaved plan, resuming, and the summary (the benchmark itself runs on a quiet machine,
not here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_generation as bench  # noqa: E402


def test_each_arm_turns_on_its_setting_and_off_is_todays_engine():
    assert bench.engine_arm_settings("off", 256, 0.25) == {
        "prefill_chunk": None,
        "compact_at": None,
    }
    assert bench.engine_arm_settings("chunked", 128, 0.25) == {
        "prefill_chunk": 128,
        "compact_at": None,
    }
    assert bench.engine_arm_settings("compact", 128, 0.3)["compact_at"] == 0.3
    assert bench.engine_arm_settings("both", 64, 0.5) == {"prefill_chunk": 64, "compact_at": 0.5}
    from selftaught.models.batching import DEFAULT_COMPACT_AT, DEFAULT_PREFILL_CHUNK

    assert (DEFAULT_PREFILL_CHUNK, DEFAULT_COMPACT_AT) == (None, None)  # off: no gain on CPU


def test_units_interleave_and_rotate_and_a_resume_skips_what_ran():
    arms = ("off", "chunked", "raw")
    order = bench.engine_plan(2, [8, 32], arms)
    assert order[:6] == [
        (0, 8, "off"),
        (0, 8, "chunked"),
        (0, 8, "raw"),
        (0, 32, "chunked"),
        (0, 32, "raw"),
        (0, 32, "off"),
    ]
    assert order[6:9] == [(1, 8, "chunked"), (1, 8, "raw"), (1, 8, "off")]
    assert len(bench.engine_plan(3, [8, 32])) == 3 * 2 * len(bench.ENGINE_ARMS)
    ran = [{"repeat": 0, "concurrency": 8, "arm": a} for a in arms]
    assert bench.engine_pending(order, ran)[0] == (0, 32, "chunked")
    assert len(bench.engine_pending(order, ran)) == 9


def test_a_resume_refuses_other_settings(tmp_path):
    from selftaught.runs import atomic_write_json

    path = tmp_path / "engine.json"
    settings = {"prefill_chunk": 256, "compact_at": 0.25}
    assert bench.resumed_units(path, settings) == []
    atomic_write_json(path, {"settings": settings, "runs": [{"repeat": 0, "arm": "off"}]})
    assert bench.resumed_units(path, settings) == [{"repeat": 0, "arm": "off"}]
    with pytest.raises(SystemExit, match="other settings"):
        bench.resumed_units(path, {**settings, "prefill_chunk": 64})


def _unit(repeat: int, arm: str, rate: float, shas=None, columns=(100, 60), compactions=0):
    row = {"repeat": repeat, "concurrency": 8, "arm": arm, "tok_per_s": rate}
    if arm != "raw":
        row["reply_sha"] = shas or ["a", "b", "c"]
        row["engine"] = {
            "decode_columns": columns[0],
            "decode_live_columns": columns[1],
            "prefill_chunks": 0,
            "compactions": compactions,
            "compacted_columns": 10 * compactions,
        }
    return row


def test_summary_pairs_each_arm_with_off_and_raw_by_repeat():
    runs = [
        _unit(0, "off", 20.0),
        _unit(0, "compact", 24.0, shas=["a", "x", "c"], columns=(80, 60), compactions=2),
        _unit(0, "raw", 40.0),
        _unit(1, "off", 10.0),
        _unit(1, "compact", 11.0, columns=(70, 60), compactions=4),
        _unit(1, "raw", 20.0),
    ]
    s = bench.summarize_engine_arms(runs)["8"]
    assert s["off"]["median"] == 15.0 and "vs_off" not in s["off"]
    assert s["off"]["vs_raw"] == 0.5
    assert s["compact"]["vs_off_per_repeat"] == [1.2, 1.1]
    assert s["compact"]["vs_off"] == pytest.approx(1.15)
    assert s["compact"]["vs_raw_per_repeat"] == [0.6, 0.55]
    assert s["compact"]["same_replies_as_off"] == 2  # the fewest over repeats
    assert s["compact"]["padding_attended"] == pytest.approx(1 - 120 / 150, abs=1e-3)
    assert s["compact"]["compactions"] == 3
    assert s["off"]["padding_attended"] == 0.4
    assert "same_replies_as_off" not in s["raw"] and s["raw"]["median"] == 30.0


def _kv_unit(repeat: int, arm: str, rate: float, rss: float, shas=None) -> dict:
    row = {
        "repeat": repeat,
        "concurrency": 8,
        "arm": arm,
        "tok_per_s": rate,
        "max_rss_gb": rss,
        "peak_rss_gb": rss - 0.5,
        "rss_after_load_gb": 1.0,
    }
    if arm != "raw":
        row["reply_sha"] = shas or ["a", "b"]
        row["engine"] = {"kv_pool_blocks": 100, "kv_peak_blocks": 40 + repeat, "kv_waits": 0}
    return row


def test_kv_arms_run_each_unit_alone_and_pair_pool_with_dynamic_and_raw(tmp_path):
    order = bench.engine_plan(2, [8], bench.KV_ARMS)
    assert order[:3] == [(0, 8, "pool"), (0, 8, "dynamic"), (0, 8, "raw")]
    assert order[3:] == [(1, 8, "dynamic"), (1, 8, "raw"), (1, 8, "pool")]
    import argparse

    ns = argparse.Namespace(
        task="gym:x",
        split="test",
        prompts=4,
        max_tokens=8,
        raw_tokens=4,
        raw_batches=1,
        rss_every=0.5,
        model=None,
        device=None,
        threads=1,
        kv_pool_mb=512.0,
    )
    cmd = bench.kv_unit_command(ns, 8, "pool", tmp_path / "u.json")
    assert cmd[cmd.index("--kv-unit") + 1] == "pool" and "--kv-arms" in cmd
    assert cmd[cmd.index("--kv-pool-mb") + 1] == "512.0" and "--model" not in cmd
    runs = [
        _kv_unit(0, "pool", 9.0, 2.0),
        _kv_unit(0, "dynamic", 10.0, 4.0),
        _kv_unit(0, "raw", 12.0, 2.5),
        _kv_unit(1, "pool", 8.0, 2.2, shas=["a", "x"]),
        _kv_unit(1, "dynamic", 8.0, 5.0),
        _kv_unit(1, "raw", 10.0, 2.5),
    ]
    s = bench.summarize_kv_arms(runs)["8"]
    assert s["pool"]["vs_dynamic_per_repeat"] == [0.9, 1.0] and s["pool"]["vs_raw"] == 0.775
    assert s["pool"]["max_rss_gb"] == 2.1 and s["dynamic"]["max_rss_gb"] == 4.5
    assert s["pool"]["peak_over_load_gb"] == pytest.approx(0.6)
    assert s["pool"]["same_replies_as_dynamic"] == 1  # the fewest over repeats
    assert s["pool"]["kv_peak_blocks"] == 41 and s["pool"]["kv_pool_blocks"] == 100
    assert "same_replies_as_dynamic" not in s["dynamic"] and "kv_peak_blocks" not in s["dynamic"]


def test_the_host_timer_gives_self_time_by_part_and_admission_keeps_its_own():
    """A part's time is its functions' less the timed calls they make; inside `admission`
    the forward is `prefill forward` and nothing else is timed apart; what no part holds of
    the total is the event loop's."""
    now = [0.0]
    timer = bench.HostTimer(clock=lambda: now[0])

    def spend(seconds: float):
        now[0] += seconds

    class Engine:
        def step(self):
            spend(1.0)
            self.forward()
            self.sample()

        def forward(self):
            spend(5.0)
            model()

        def sample(self):
            spend(0.5)

        def admit(self):
            spend(2.0)
            self.sample()  # not timed apart inside admission
            self.forward()  # the prefill's forward, model included

    def model():
        spend(3.0)

    for name, part in [
        ("step", "bookkeeping"),
        ("forward", "forward_call"),
        ("sample", "sample"),
        ("admit", "admission"),
    ]:
        assert timer.patch(Engine, name, part)
    assert not timer.patch(Engine, "absent", "inputs")  # a name a source tree lacks
    module = type(bench)("fake")
    module.model = model
    timer.patch(module, "model", "model_forward")
    model = module.model  # (the engine looks the model up where it is patched)
    engine = Engine()
    engine.step()
    engine.admit()
    timer.restore()
    assert timer.seconds == {
        "bookkeeping": 1.0,
        "forward_call": 5.0,
        "model_forward": 3.0,
        "sample": 0.5,
        "admission": 2.5,
        "prefill_forward": 8.0,
    }
    assert not hasattr(Engine.step, "__wrapped__")  # restored
    parts = bench.host_parts_ms(timer.seconds, total=21.0, steps=2)
    assert list(parts) == list(bench.HOST_PARTS)
    assert parts["event_loop"] == 500.0 and parts["forward_call"] == 2500.0


def _host_unit(repeat: int, arm: str, tok_per_cpu_s: float, shas=None) -> dict:
    row = {
        "repeat": repeat,
        "concurrency": 8,
        "arm": arm,
        "ms_per_step": 2.0,
        "wall_ms_per_step": 3.0,
        "tok_per_cpu_s": tok_per_cpu_s,
        "load_before": 1.0,
    }
    if arm != "raw":
        row["host_ms_per_step"] = 1.0 if arm == "before" else 0.5
        row["decode_steps"] = 10
        row["parts_ms"] = {part: 0.1 for part in bench.HOST_PARTS}
        row["reply_sha"] = shas or ["a", "b"]
    return row


def test_the_host_summary_pairs_each_arm_with_raw_and_the_first_arms_replies():
    runs = [
        _host_unit(0, "before", 50.0),
        _host_unit(0, "after", 80.0, shas=["a", "x"]),
        _host_unit(0, "raw", 100.0),
        _host_unit(1, "before", 60.0),
        _host_unit(1, "after", 90.0),
        _host_unit(1, "raw", 100.0),
    ]
    s = bench.summarize_host(runs, ("before", "after", "raw"))["8"]
    assert s["before"]["vs_raw_per_repeat"] == [0.5, 0.6] and s["after"]["vs_raw"] == 0.85
    assert s["after"]["host_ms_per_step"] == 0.5 and s["after"]["parts_ms"]["inputs"] == 0.1
    assert s["after"]["same_replies_as_before"] == 1  # the fewest over repeats
    assert "same_replies_as_before" not in s["before"] and "parts_ms" not in s["raw"]
    assert bench.reply_caps(64, 256) == bench.reply_caps(64, 256)  # the same every unit
    assert min(bench.reply_caps(64, 256)) >= 8 and max(bench.reply_caps(64, 256)) <= 176
