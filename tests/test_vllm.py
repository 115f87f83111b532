"""vLLM as the engine (`selftaught.models.vllm`): its runtime LoRA API against a scripted vLLM
(`tests.fake_upstream`), and `selftaught vllm-up`, which prints or starts the `vllm serve`
command selftaught needs (vLLM itself is not installed here: no GPU)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from selftaught.cli import app
from selftaught.errors import InputError
from selftaught.models.base import run_sync
from selftaught.models.errors import FatalBackendError
from selftaught.models.vllm import (
    StaleAdapter,
    adapter_rank,
    load_lora,
    lora_rank,
    unload_lora,
)
from tests.fake_upstream import FakeUpstream


def call(fn, upstream: FakeUpstream, *args: str) -> None:
    async def go() -> None:
        async with httpx.AsyncClient(timeout=10) as client:
            await fn(client, upstream.base_url, *args)

    run_sync(go())


def test_a_load_is_checked_and_a_name_held_for_another_folder_is_stale():
    with FakeUpstream(model="base") as upstream:
        call(load_lora, upstream, "a", "/runs/r/rounds/1/adapter")
        call(load_lora, upstream, "a", "/runs/r/rounds/1/adapter/")  # held, same folder: fine
        with pytest.raises(StaleAdapter, match="serves 'a' from /runs/r/rounds/1/adapter, not /x"):
            call(load_lora, upstream, "a", "/x")
        call(unload_lora, upstream, "a")
        call(unload_lora, upstream, "a")  # already gone: nothing to do
        assert upstream.adapters == {} and upstream.lora_unloads == ["a"]


def test_a_server_without_runtime_lora_is_refused_with_the_way_to_start_it():
    with FakeUpstream(model="base") as upstream:
        upstream.faults.append("404")  # vLLM without VLLM_ALLOW_RUNTIME_LORA_UPDATING
        with pytest.raises(FatalBackendError, match="VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"):
            call(load_lora, upstream, "a", "/x")


def test_max_lora_rank_is_the_adapters_rounded_up_to_a_rank_vllm_takes(tmp_path):
    assert [lora_rank(r) for r in (1, 2, 16, 17, 40, 512)] == [1, 8, 16, 32, 64, 512]
    with pytest.raises(InputError, match="above vLLM's largest"):
        lora_rank(600)
    config = {"peft_type": "LORA", "r": 12, "rank_pattern": {"q_proj": 24}}
    (tmp_path / "adapter_config.json").write_text(json.dumps(config))
    assert adapter_rank(tmp_path) == 24


def model_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return folder


def test_vllm_up_prints_the_command_rest_and_the_proxy_need(tmp_path):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 20}))
    folder = model_folder(tmp_path)
    args = ["vllm-up", "--print", "--model", f"local:{folder}", "--adapter", str(adapter)]
    result = CliRunner().invoke(app, [*args, "--port", "8011", "--", "--max-model-len", "2048"])
    assert result.exit_code == 0, result.output
    line = result.stdout.splitlines()[0]
    assert line.startswith("VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve ")
    assert f" {folder} " in line and "--enable-lora --max-lora-rank 32" in line
    assert "--served-model-name base" in line and line.endswith("--max-model-len 2048")
    assert "--sampler-url http://127.0.0.1:8011/v1" in result.output


def test_vllm_up_for_grpo_is_trls_own_command(tmp_path):
    args = ["vllm-up", "--print", "--for", "grpo", "--model", f"local:{model_folder(tmp_path)}"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    line = result.stdout.splitlines()[0]
    assert line.startswith("VLLM_SERVER_DEV_MODE=1 vllm serve ")
    assert "--weight-transfer-config" in line and "--logprobs-mode processed_logprobs" in line
    assert "--enable-lora" not in line and "--vllm-server http://127.0.0.1:8000" in result.output


def test_vllm_up_refuses_without_vllm_and_for_a_remote_model(tmp_path):
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here")
    folder = model_folder(tmp_path)
    result = CliRunner().invoke(app, ["vllm-up", "--model", f"local:{folder}"])
    assert result.exit_code == 6 and "needs vLLM, which is not installed" in result.output
    remote = CliRunner().invoke(app, ["vllm-up", "--model", "http://h:1/v1#m", "--print"])
    assert remote.exit_code == 2 and "serves a local model" in remote.output
