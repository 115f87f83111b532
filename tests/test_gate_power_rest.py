"""Power said before a run (issue 65) on `train --method rest`: the line comes before the
base model's first evaluation, on the tiny random model of tests/test_weights_rest.py."""

from __future__ import annotations

import io
import os

import pytest
from rich.console import Console

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("torch")
pytest.importorskip("trl")

from selftaught.gate import GateConfig  # noqa: E402
from selftaught.weights.rest import RestTrainer  # noqa: E402
from tests import test_weights_rest  # noqa: E402
from tests.test_weights_rest import EchoTask, config, scripted_eval  # noqa: E402

tiny_dir = test_weights_rest.tiny_dir  # the fixture: a tiny random model on disk


def test_train_says_its_power_before_the_first_model_call(tiny_dir, tmp_path, monkeypatch):
    buf = io.StringIO()
    seen: list[str] = []
    scripted_eval(monkeypatch, [0.5, 0.5])
    scripted = RestTrainer._eval

    def first_look(self, model, r, split):  # the base model's val: the run's first call
        seen.append(buf.getvalue())
        return scripted(self, model, r, split)

    monkeypatch.setattr(RestTrainer, "_eval", first_look)
    cfg = config(1)
    cfg.gate = GateConfig(min_gain=0.5)
    console = Console(file=buf, width=400)
    RestTrainer(cfg, EchoTask(), tiny_dir, output_dir=tmp_path / "run", console=console).train()
    assert seen[0].startswith(
        "power: on 4 val items the gate can accept a gain of 2 net items (0.50 of val) at the "
        "least; a gain of 0.5 is within reach: it needs at least 4 val items"
    )
