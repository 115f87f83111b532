"""bf16 decided per CPU and apart for inference and training (`selftaught.models.device`): the
`SELFTAUGHT_DTYPE` setting, what `auto` resolves to with the CPU check and the per-CPU
constants scripted, a folder model's fingerprint naming its dtype, the fine-tune's autocast
(and its report saying it), the `--bf16` flag's method check and doctor's lines."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from selftaught import doctor
from selftaught.errors import ConfigError, InputError
from selftaught.models import device as dev
from selftaught.models.device import CpuBf16, Precision

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")

WITH = CpuBf16(avx512_bf16=True, amx=False)
WITHOUT = CpuBf16(avx512_bf16=False, amx=False)


@pytest.fixture
def cpu_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    monkeypatch.delenv(dev.DTYPE_ENV, raising=False)


def scripted(monkeypatch: pytest.MonkeyPatch, cpu: CpuBf16, *, inference: bool, training: bool):
    monkeypatch.setattr(dev, "cpu_bf16_support", lambda: cpu)
    monkeypatch.setattr(dev, "CPU_BF16_INFERENCE", inference)
    monkeypatch.setattr(dev, "CPU_BF16_TRAINING", training)


def test_the_setting_is_read_and_a_wrong_one_names_the_valid_ones():
    assert dev.dtype_setting({}) == "auto"
    assert dev.dtype_setting({dev.DTYPE_ENV: " "}) == "auto"
    assert dev.dtype_setting({dev.DTYPE_ENV: "BFloat16"}) == "bfloat16"
    assert dev.dtype_setting({dev.DTYPE_ENV: "float32"}) == "float32"
    with pytest.raises(ConfigError, match="one of auto, float32, bfloat16, got 'bf16'"):
        dev.dtype_setting({dev.DTYPE_ENV: "bf16"})


def test_the_cpu_check_is_torchs_own():
    found = dev.cpu_bf16_support()
    assert found.avx512_bf16 == torch.cpu._is_avx512_bf16_supported()
    assert found.amx == torch.cpu._is_amx_tile_supported()
    assert CpuBf16(False, True).supported and WITH.supported and not WITHOUT.supported
    assert WITHOUT.describe() == "neither AVX512-BF16 nor AMX"


def test_auto_inference_is_bf16_only_on_a_bf16_cpu_with_the_constant_on(cpu_only, monkeypatch):
    for cpu, on, expected in (
        (WITH, True, torch.bfloat16),
        (WITH, False, torch.float32),
        (WITHOUT, True, torch.float32),
    ):
        scripted(monkeypatch, cpu, inference=on, training=False)
        assert dev.inference_dtype("cpu") is expected
        assert dev.inference_dtype("cpu", "auto") is expected
    # a setting wins over auto either way; training's load dtype stays float32
    assert dev.inference_dtype("cpu", "float32") is torch.float32
    scripted(monkeypatch, WITHOUT, inference=False, training=False)
    assert dev.inference_dtype("cpu", "bfloat16") is torch.bfloat16
    scripted(monkeypatch, WITH, inference=True, training=True)
    assert dev.resolve_device("cpu") == ("cpu", torch.float32)


def test_accelerators_keep_their_half_precision(monkeypatch):
    scripted(monkeypatch, WITH, inference=True, training=True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert dev.inference_dtype("cuda") is torch.float16
    assert dev.training_autocast(None, "accelerator") is False  # today's: weights are half


def test_training_autocast_auto_and_forced(monkeypatch):
    for cpu, on, expected in ((WITH, True, True), (WITH, False, False), (WITHOUT, True, False)):
        scripted(monkeypatch, cpu, inference=False, training=on)
        assert dev.training_autocast(None, "cpu") is expected
    scripted(monkeypatch, WITHOUT, inference=False, training=False)
    assert dev.training_autocast(True, "cpu") is True
    scripted(monkeypatch, WITH, inference=True, training=True)
    assert dev.training_autocast(False, "cpu") is False


def model_folder(root: Path) -> Path:
    """A folder that passes for a model's files (nothing here loads it)."""
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (root / "model.safetensors").write_bytes(b"\x00" * 64)
    return root


def test_a_folder_fingerprint_names_its_dtype(cpu_only, monkeypatch, tmp_path):
    from selftaught.models.errors import FatalBackendError
    from selftaught.models.fingerprint import fingerprint_path
    from selftaught.models.local_weights import LocalWeights

    folder = str(model_folder(tmp_path / "m"))
    scripted(monkeypatch, WITH, inference=False, training=False)
    plain = LocalWeights(folder).fingerprint
    assert plain == f"local:files:{fingerprint_path(folder)}"  # float32: the key it had
    monkeypatch.setenv(dev.DTYPE_ENV, "bfloat16")
    from_env = LocalWeights(folder)
    assert from_env.fingerprint == f"{plain}:bfloat16"
    assert from_env.placement() == ("cpu", torch.bfloat16)
    monkeypatch.delenv(dev.DTYPE_ENV)
    assert LocalWeights(folder, dtype="bfloat16").fingerprint == f"{plain}:bfloat16"
    scripted(monkeypatch, WITH, inference=True, training=False)  # auto → bf16 here
    assert LocalWeights(folder).fingerprint == f"{plain}:bfloat16"
    monkeypatch.setenv(dev.DTYPE_ENV, "float32")  # the setting wins over auto
    assert LocalWeights(folder).fingerprint == plain
    monkeypatch.setenv(dev.DTYPE_ENV, "half")
    with pytest.raises(FatalBackendError, match="SELFTAUGHT_DTYPE must be one of") as err:
        _ = LocalWeights(folder).fingerprint
    assert err.value.exit_code == InputError.exit_code


def test_a_local_model_says_what_dtype_it_answers_in_for_the_score_caches(cpu_only, tmp_path):
    """What a `ScoreCache` keys on: a folder model's dtype before it loads, an in-memory
    model's weights', through the wrappers a run puts around it; float32 keeps bare keys."""
    from selftaught.evaluation import ScoreCache, answer_dtype
    from selftaught.models.cache import CachedModel, ResponseCache
    from selftaught.models.local import LocalModel
    from selftaught.models.usage import TrackedModel, UsageLedger

    folder = str(model_folder(tmp_path / "m"))
    bf16 = LocalModel(folder, dtype="bfloat16")
    assert bf16.answer_dtype == "bfloat16" and bf16._weights.model is None  # not loaded
    wrapped = TrackedModel(CachedModel(bf16, ResponseCache(tmp_path / "c.db")), UsageLedger(), "t")
    assert answer_dtype(wrapped) == "bfloat16"
    assert answer_dtype(LocalModel(folder, dtype="float32")) is None
    assert answer_dtype(object()) is None  # an API model says nothing
    cache = ScoreCache(dtype="bfloat16")
    cache.add("h", {"a": [1.0, 1.0]})
    assert cache.data == {"h@bfloat16": {"a": [1.0, 1.0]}} and cache.complete("h", ["a"])
    assert not ScoreCache(data=cache.data).complete("h", ["a"])  # float32 scores again


def test_an_in_memory_fingerprint_hashes_the_dtype():
    from selftaught.models.fingerprint import fingerprint_module

    model = torch.nn.Linear(4, 4)
    before = fingerprint_module(model)
    assert fingerprint_module(model.to(torch.bfloat16)) != before


def test_a_fine_tune_runs_in_the_autocast_auto_picks_and_says_so(monkeypatch, tmp_path):
    pytest.importorskip("trl")
    from selftaught.weights.config import SFTTrainConfig
    from selftaught.weights.scratch import scratch_tokenizer
    from selftaught.weights.sft import _sft_args, autocast_bf16, sft_train
    from tests.test_weights_sft import samples, tiny

    tok = scratch_tokenizer()
    model = tiny(tok)
    cfg = SFTTrainConfig(epochs=1, batch_size=2, learning_rate=1e-3, max_steps=1)
    assert SFTTrainConfig().bf16 is None
    scripted(monkeypatch, WITH, inference=False, training=False)
    assert autocast_bf16(cfg, model) is False
    off = _sft_args(model, cfg, tmp_path, backend="full", seed=0, progress=False,
                    report_to="none", run_name=None)  # fmt: skip
    assert off.bf16 is False
    assert autocast_bf16(SFTTrainConfig(bf16=True), model) is True
    scripted(monkeypatch, WITH, inference=False, training=True)
    report = sft_train(model, tok, samples(2), cfg, backend="full", progress=False)
    assert report["autocast"] == "bf16" and report["dtype"] == "float32"


def test_bf16_is_refused_for_online_rl():
    from selftaught.cli.train import check_method_options

    check_method_options("rest", {"--bf16"})
    check_method_options("dpo", {"--bf16"})
    with pytest.raises(ConfigError, match="--bf16"):
        check_method_options("grpo", {"--bf16"})


def test_doctor_prints_what_auto_gives_here(monkeypatch):
    from selftaught.models.threads import ThreadChoice

    choice = ThreadChoice(usable=2, busy=0.0, setting=None, ceiling=2, threads=2)
    monkeypatch.setattr(doctor, "measure", lambda: choice)
    monkeypatch.delenv(dev.DTYPE_ENV, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    scripted(monkeypatch, WITH, inference=True, training=False)
    report = doctor.diagnose(None)
    assert report.precision == Precision("cpu", WITH, "auto", "bfloat16", False)
    lines = doctor.report_lines(report)
    assert lines[3:6] == [
        "bf16 on this CPU: AVX512-BF16",
        "inference dtype: bfloat16 (auto on cpu; SELFTAUGHT_DTYPE=float32|bfloat16 fixes it)",
        "training autocast: off (auto on cpu; train --bf16 / --no-bf16 forces it)",
    ]
    assert doctor.DoctorReport.from_dict(report.to_dict()) == report
    monkeypatch.setenv(dev.DTYPE_ENV, "float32")
    lines = doctor.report_lines(doctor.diagnose(None))
    assert "inference dtype: float32 (fixed by SELFTAUGHT_DTYPE=float32)" in lines
