"""Adopted adapters: a version holds its LoRA adapter beside its skill; adopt, a text-only adopt
on top, and rollback switch it atomically; `selftaught serve --project`, the proxy's local
upstream and a vLLM upstream (`--lora`) serve whichever version is adopted, without a restart.
Staging and the vLLM route with fakes; serving with a real peft adapter on the embedded model."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from selftaught.runs import atomic_write_json, atomic_write_text
from selftaught.sleep.adoption import staging
from selftaught.sleep.night.summary import history_tables, status_lines
from selftaught.sleep.paths import read_adopted
from tests import loopback
from tests.fake_upstream import FakeUpstream

PROJECT = "demo"


def stage_night(
    home: Path,
    night: str,
    *,
    skill: str = "Be brief.",
    adapter: Path | None = None,
    base_version: int = 0,
) -> Path:
    """A staged night as a weight night leaves it (report.json, proposal/, adapter/)."""
    folder = staging.nights_dir(PROJECT, home) / night
    atomic_write_text(folder / "proposal" / "skill.md", skill)
    atomic_write_text(folder / "proposal" / "memory.md", "")
    proposal: dict = {"val_before": None, "val_after": None, "candidate": "text"}
    if adapter is not None:
        import shutil

        shutil.copytree(adapter, folder / "adapter")
        proposal["candidate"] = "sft"
        proposal["adapter"] = {"dir": "adapter", "method": "sft", "base_model": "local"}
    report = {
        "kind": staging.NIGHT_KIND,
        "night": night,
        "status": "staged",
        "base_version": base_version,
        "proposal": proposal,
    }
    atomic_write_json(folder / "report.json", report)
    return folder


def fake_adapter(folder: Path, content: bytes = b"weights") -> Path:
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text('{"peft_type": "LORA"}')
    (folder / "adapter_model.safetensors").write_bytes(content)
    return folder


# ---- staging ----------------------------------------------------------------------------------


def test_adopt_keeps_the_adapter_in_the_version_and_rollback_switches_it(tmp_path):
    home = tmp_path / "home"
    stage_night(home, "n1", adapter=fake_adapter(tmp_path / "a1"))
    assert staging.adopt(PROJECT, "n1", home=home).version == 1
    v1 = staging.versions_dir(PROJECT, home) / "1" / "adapter"
    assert (v1 / "adapter_model.safetensors").read_bytes() == b"weights"
    assert read_adopted(PROJECT, home).adapter == v1
    assert staging.read_adopted_files(PROJECT, home).adapter == v1
    meta = json.loads((v1.parent / "meta.json").read_text())
    assert meta["adapter"]["method"] == "sft" and meta["adapter"]["night"] == "n1"

    # a text-only night gated against version 1 keeps serving version 1's adapter
    stage_night(home, "n2", skill="Be kind.", base_version=1)
    assert staging.adopt(PROJECT, "n2", home=home).version == 2
    v2 = staging.versions_dir(PROJECT, home) / "2" / "adapter"
    assert read_adopted(PROJECT, home).adapter == v2 and v2.is_dir()
    assert json.loads((v2.parent / "meta.json").read_text())["adapter"]["carried_from"] == 1

    staging.rollback(PROJECT, 0, home=home)
    assert read_adopted(PROJECT, home).adapter is None  # version 0: the base model
    staging.rollback(PROJECT, 1, home=home)
    adopted = read_adopted(PROJECT, home)
    assert adopted.adapter == v1 and adopted.skill == "Be brief."


def test_a_staged_adapter_that_went_missing_is_refused_and_nothing_changes(tmp_path):
    home = tmp_path / "home"
    night = stage_night(home, "n1", adapter=fake_adapter(tmp_path / "a1"))
    (night / "adapter" / "adapter_config.json").unlink()
    with pytest.raises(staging.StagingError, match="adapter_config.json missing"):
        staging.adopt(PROJECT, "n1", home=home)
    assert staging.current_version(PROJECT, home) == 0
    assert staging.version_numbers(PROJECT, home) == []
    assert staging.read_report(night)["status"] == "staged"


def test_history_and_status_say_which_adapter_serves(tmp_path):
    from rich.console import Console

    home = tmp_path / "home"
    stage_night(home, "n1", adapter=fake_adapter(tmp_path / "a1"))
    staging.adopt(PROJECT, "n1", home=home)
    stage_night(home, "n2", base_version=1)
    staging.adopt(PROJECT, "n2", home=home)
    console = Console(record=True, width=160)
    for table in history_tables(PROJECT, home):
        console.print(table)
    text = console.export_text()
    assert "sft adapter of n1, kept from v1" in text and "base" in text
    lines = status_lines(PROJECT, home)
    assert lines[0].startswith("demo: adopted version 2, serving sft adapter of n1")
    staging.rollback(PROJECT, 0, home=home)
    assert status_lines(PROJECT, home)[0].startswith("demo: adopted version 0, serving base")


# ---- a vLLM upstream --------------------------------------------------------------------------


def lora_proxy(upstream: FakeUpstream, tmp_path: Path, home: Path):
    """The proxy (`--lora`) in front of `upstream` as a vLLM server of `base-model`."""
    from selftaught.sleep.intake.proxy import ProxyConfig, proxy_in_background

    config = ProxyConfig(
        upstream=f"{upstream.base_url}#base-model",
        project=PROJECT,
        port=0,
        log_path=tmp_path / "log.db",
        home=home,
        lora=True,
    )
    return proxy_in_background(config)


def say_hi(url: str) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": "hi"}]}
    return loopback.post(f"{url}/chat/completions", json=body, timeout=30)


def test_a_vllm_upstream_loads_the_adopted_adapter_once_and_gets_requests_for_it(tmp_path):
    home = tmp_path / "home"
    with FakeUpstream() as upstream:
        with lora_proxy(upstream, tmp_path, home) as (url, _):
            assert say_hi(url).status_code == 200
            assert upstream.requests[-1]["model"] == "base-model" and not upstream.lora_loads
            stage_night(home, "n1", adapter=fake_adapter(tmp_path / "a1"))
            staging.adopt(PROJECT, "n1", home=home)
            assert say_hi(url).status_code == 200 and say_hi(url).status_code == 200
            adapter = staging.versions_dir(PROJECT, home) / "1" / "adapter"
            assert upstream.lora_loads == [{"lora_name": "demo-v1", "lora_path": str(adapter)}]
            assert upstream.requests[-1]["model"] == "demo-v1"

            stage_night(home, "n2", adapter=fake_adapter(tmp_path / "a2", b"new"), base_version=1)
            staging.adopt(PROJECT, "n2", home=home)
            upstream.faults.append("400")  # vLLM refuses the new adapter
            refused = say_hi(url)
            assert refused.status_code == 502 and "refused to load adapter" in refused.text
            assert len(upstream.requests) == 3  # the request was not sent to the base instead
            staging.rollback(PROJECT, 0, home=home)
            assert say_hi(url).status_code == 200 and upstream.requests[-1]["model"] == "base-model"


def test_a_restarted_proxy_finds_its_adapter_loaded_and_refuses_another_under_its_name(tmp_path):
    """vLLM outlives the proxy: a proxy started again finds the adopted adapter already loaded
    under its name (vLLM's 400) and uses it once `/v1/models` shows it was loaded from that
    folder; a server that holds another folder under the name is refused (502), and no request
    is sent to the name (stale weights would answer it)."""
    home = tmp_path / "home"
    stage_night(home, "n1", adapter=fake_adapter(tmp_path / "a1"))
    staging.adopt(PROJECT, "n1", home=home)
    adapter = str(staging.versions_dir(PROJECT, home) / "1" / "adapter")
    for held, status in ((adapter, 200), ("/srv/other/adapter", 502)):
        with FakeUpstream() as upstream:
            upstream.adapters["demo-v1"] = held  # loaded before this proxy started
            with lora_proxy(upstream, tmp_path, home) as (url, _):
                answer = say_hi(url)
            assert answer.status_code == status, answer.text
            assert upstream.lora_loads == [{"lora_name": "demo-v1", "lora_path": adapter}]
            if status == 200:
                assert upstream.requests[-1]["model"] == "demo-v1"
            else:
                assert "from /srv/other/adapter, not" in answer.text and not upstream.requests


def test_lora_needs_an_http_upstream():
    from selftaught.sleep.intake.proxy import ProxyConfig, ProxyError, build_upstream

    with pytest.raises(ProxyError, match="--lora needs a vLLM upstream"):
        build_upstream(ProxyConfig(upstream="local", lora=True))


# ---- the embedded model with a real adapter ------------------------------------------------------


@pytest.fixture(scope="module")
def embedded(tmp_path_factory):
    """The embedded model and a real peft adapter for it whose LoRA weights were moved off
    zero, so that it changes the greedy replies."""
    pytest.importorskip("peft")
    import torch

    from selftaught.models.embedded import EmbeddedModelMissing, embedded_model_dir
    from selftaught.models.local import LocalModel
    from selftaught.weights.config import BackendConfig
    from selftaught.weights.sft import load_causal_lm, prepare_trainable

    try:
        path = embedded_model_dir()
    except EmbeddedModelMissing as err:
        pytest.skip(f"embedded model unavailable: {err}")
    base, _ = load_causal_lm(path)
    torch.manual_seed(0)  # peft draws lora_A from the global generator
    peft_model = prepare_trainable(base, BackendConfig(lora_r=4, lora_alpha=8))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    folder = tmp_path_factory.mktemp("adapter") / "adapter"
    peft_model.save_pretrained(folder)
    return LocalModel(str(path)), folder


ASK = [{"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def expected(embedded):
    """The greedy replies to ASK of the base and of the base with the adapter, once for the
    module (they are deterministic): the adapter changes the reply."""
    from selftaught.models.adapters import with_adapter
    from selftaught.models.base import GenerationParams

    base, adapter = embedded
    params = GenerationParams(max_tokens=8, temperature=0)
    replies = base.chat(ASK, params).text, with_adapter(base, adapter).chat(ASK, params).text
    assert replies[1] != replies[0]
    return replies


def _reply(url: str) -> str:
    body = {"messages": ASK, "max_tokens": 8, "temperature": 0}
    resp = loopback.post(f"{url}/chat/completions", json=body, timeout=120)
    resp.raise_for_status()
    return resp.json()["choices"][0]["message"]["content"]


def test_the_proxy_serves_the_adopted_adapter_and_the_rollback_without_a_restart(
    tmp_path, embedded, expected
):
    """adopt → the proxy's local upstream answers with the adapter; rollback → the base again;
    the same process throughout."""
    from selftaught.sleep.adoption.serving import FollowAdopted
    from selftaught.sleep.intake.proxy import ProxyConfig, Upstream, proxy_in_background

    base, adapter = embedded
    home = tmp_path / "home"
    expected_base, expected_adapted = expected  # the adapter changes the reply
    followed = FollowAdopted(base, PROJECT, home)
    from selftaught.serve import create_app

    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(followed, "m")))
    upstream = Upstream(client, "http://localhost/v1", "m", True, None, False)
    config = ProxyConfig(
        upstream="local", project=PROJECT, port=0, log_path=tmp_path / "l.db", home=home
    )
    with proxy_in_background(config, upstream=upstream) as (url, _):
        assert _reply(url) == expected_base
        stage_night(home, "n1", skill="", adapter=adapter)
        staging.adopt(PROJECT, "n1", home=home)
        assert _reply(url) == expected_adapted
        assert _reply(url) == expected_adapted and followed.switches == 1
        staging.rollback(PROJECT, home=home)
        assert _reply(url) == expected_base and followed.switches == 2


def test_an_adapter_for_another_base_is_refused(tmp_path, embedded):
    from selftaught.models.adapters import AdapterError, check_adapter

    base, adapter = embedded
    other = tmp_path / "other"
    other.mkdir()
    config = json.loads((adapter / "adapter_config.json").read_text())
    (other / "adapter_config.json").write_text(
        json.dumps({**config, "base_model_name_or_path": str(tmp_path)})
    )
    with pytest.raises(AdapterError, match="was trained on"):
        check_adapter(base, other)
    with pytest.raises(AdapterError, match="not a LoRA adapter"):
        check_adapter(base, tmp_path)


def test_a_night_after_an_adapter_was_adopted_measures_it_and_trains_on_from_it(tmp_path, embedded):
    """The night's target is what serves (base + adopted adapter), and a weight night's new
    adapter starts from the adopted one, so that it applies to the base alone."""
    import torch

    from selftaught.sleep.night.cycle import NightModels
    from selftaught.sleep.night.start_end import as_served
    from selftaught.sleep.night.weight_night import LocalAdapterTrainer, WeightNightConfig
    from selftaught.sleep.result import NightDraft
    from selftaught.weights.config import BackendConfig

    base, adapter = embedded
    home = tmp_path / "home"
    stage_night(home, "n1", adapter=adapter)
    staging.adopt(PROJECT, "n1", home=home)
    adopted = staging.read_adopted_files(PROJECT, home)
    night = NightDraft(project=PROJECT, night_dir=None)
    models = as_served(NightModels(base, "local", base, "local"), adopted, night)
    assert models.target is not base and night.adapter and night.adapter.version == "1"
    trainer = LocalAdapterTrainer("local", WeightNightConfig(), models.target)
    trainer._load()
    assert trainer.start_adapter == adopted.adapter and trainer._base is base.model
    name, weight = next((n, p) for n, p in base.model.named_parameters() if "q_proj" in n)
    before = weight.detach().clone()
    trainable = trainer._trainable(BackendConfig())
    saved = {n: p for n, p in trainable.named_parameters() if "lora_B" in n}
    assert saved and all(p.requires_grad for p in saved.values())
    assert all(p.abs().sum() > 0 for p in saved.values())  # not a fresh (zero) lora_B
    assert torch.equal(dict(base.model.named_parameters())[name], before)  # the base: a copy


def test_serve_project_needs_a_local_model():
    import typer

    from selftaught.cli.eval_serve import follow_project
    from tests.scripted import ScriptedModel

    with pytest.raises(typer.BadParameter, match="only a local model can serve an adopted"):
        follow_project(ScriptedModel(lambda m: "x", "scripted"), PROJECT)


@pytest.mark.parametrize("mode", ["serve", "shadow"])
def test_a_canary_tries_a_staged_adapter_on_live_requests(tmp_path, embedded, expected, mode):
    """Before adoption: with `--canary-share 1` a staged adapter answers every request (serve)
    or answers beside the adopted base, logged as a shadow row the client never sees."""
    from selftaught.sleep.adoption.serving import FollowAdopted
    from selftaught.sleep.intake.log import LogFilter, TaskLog
    from selftaught.sleep.intake.proxy import ProxyConfig, in_process_upstream, proxy_in_background

    base, adapter = embedded
    home = tmp_path / "home"
    expected_base, expected_adapted = expected
    stage_night(home, "n1", skill="", adapter=adapter)
    config = ProxyConfig(
        upstream="local",
        project=PROJECT,
        port=0,
        log_path=tmp_path / "log.db",
        home=home,
        canary_share=1.0,
        canary_mode=mode,
    )
    upstream = in_process_upstream(FollowAdopted(base, PROJECT, home))
    with proxy_in_background(config, upstream=upstream) as (url, app):
        reply = _reply(url)
        app.state.proxy.writer.flush(30)
    assert reply == (expected_adapted if mode == "serve" else expected_base)
    rows = TaskLog(tmp_path / "log.db").query(LogFilter(project=PROJECT))
    labels = sorted((r.skill_version or "", r.shadow_of is not None, r.reply) for r in rows)
    if mode == "serve":
        assert labels == [("staged:n1", False, expected_adapted)]
    else:
        assert labels == [("", False, expected_base), ("staged:n1", True, expected_adapted)]
    assert staging.current_version(PROJECT, home) == 0  # nothing was adopted


def test_probation_tallies_each_version_and_rolls_back_a_worse_adapter(
    tmp_path, embedded, expected
):
    """The embedded model behind `proxy --auto-rollback`: every reply is corrected with what
    the base answers, so the adopted (forced) adapter's replies fail where the base's passed;
    each version is tallied on its own rows and the drop rolls back to the base, live."""
    from selftaught.sleep.adoption.serving import FollowAdopted
    from selftaught.sleep.intake.log import TaskLog
    from selftaught.sleep.intake.probation import ProbationConfig, probation_for
    from selftaught.sleep.intake.proxy import ProxyConfig, in_process_upstream, proxy_in_background

    base, adapter = embedded
    home = tmp_path / "home"
    right = expected[0]  # what the base answers
    config = ProxyConfig(
        upstream="local",
        project=PROJECT,
        port=0,
        log_path=tmp_path / "log.db",
        home=home,
        auto_rollback=True,
        probation_every=1,
        probation=ProbationConfig(min_outcomes=4, confidence=0.95),
        feedback_key="operator-feedback-key",  # the operator's corrections: probation counts them
    )
    upstream = in_process_upstream(FollowAdopted(base, PROJECT, home))

    def served_and_corrected(url: str, n: int) -> None:
        for _ in range(n):
            body = {"messages": ASK, "max_tokens": 8, "temperature": 0}
            resp = loopback.post(f"{url}/chat/completions", json=body, timeout=120)
            iid = resp.headers["x-selftaught-interaction-id"]
            fb = {"id": iid, "reference": right}
            operator = {"x-api-key": "operator-feedback-key"}
            loopback.post(
                f"{url}/feedback", json=fb, headers=operator, timeout=60
            ).raise_for_status()

    with proxy_in_background(config, upstream=upstream) as (url, app):
        served_and_corrected(url, 4)  # version 0: the base
        stage_night(home, "n1", skill="", adapter=adapter)
        assert staging.adopt(PROJECT, "n1", home=home, force=True).version == 1
        served_and_corrected(url, 4)  # version 1: the adapter
        deadline = time.monotonic() + 60
        while staging.current_version(PROJECT, home) != 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        app.state.proxy.writer.flush(30)
    assert staging.current_version(PROJECT, home) == 0  # rolled back, without a restart
    (event,) = [e for e in staging.events(PROJECT, home) if e["event"] == "auto_rollback"]
    assert event["previous"] == 1 and event["probation"]["verdict"] == "drop"
    result = probation_for(PROJECT, TaskLog(tmp_path / "log.db"), home=home)
    tallies = {t.version: (t.requests, t.outcomes, t.successes) for t in result.tallies}
    assert tallies["1"] == (4, 4, 0) and tallies["0"] == (4, 4, 4)
