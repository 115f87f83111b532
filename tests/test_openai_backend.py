"""The error policy against a real HTTP server on loopback: transient faults are retried
(and counted), fatal ones stop at once with one clear sentence, never scored as answers."""

from __future__ import annotations

import re
import socket

import pytest

from selftaught.models import FatalBackendError, GenerationParams, RetryPolicy, load_model
from selftaught.models.errors import TransientBackendError
from selftaught.models.openai_compat import OpenAICompatModel
from tests.fault_server import FaultServer

FAST = RetryPolicy(max_retries=4, base_delay_s=0.01, max_delay_s=0.05)
MSGS = [{"role": "user", "content": "What is 40 + 2?"}]


def make(server: FaultServer, **kw) -> OpenAICompatModel:
    kw.setdefault("retry", FAST)
    kw.setdefault("timeout_s", 0.5)
    return OpenAICompatModel("fake-model", base_url=server.base_url, **kw)


def test_transient_faults_are_retried_and_counted():
    with FaultServer() as server:
        server.faults.extend(["timeout", "429", "500", "empty"])
        c = make(server).chat(MSGS, GenerationParams(max_tokens=7))
    assert c.text == "42"
    assert c.retries == 4
    assert server.chat_requests() == 5
    # max_tokens is what llama.cpp honours; it must be sent on every call
    assert all(r["max_tokens"] == 7 for r in server.requests)


def test_retries_are_bounded_then_transient_error():
    with FaultServer() as server:
        server.faults.extend(["503"] * 10)
        with pytest.raises(TransientBackendError, match="gave up after 4 retries") as info:
            make(server).chat(MSGS, GenerationParams())
    assert info.value.retries == 4
    assert server.chat_requests() == 5


def test_401_is_fatal_at_once():
    with FaultServer(require_key="right") as server:
        with pytest.raises(FatalBackendError, match="API key was rejected"):
            make(server, api_key="wrong").chat(MSGS, GenerationParams())
    assert server.chat_requests() == 0  # preflight stopped it before any chat call


def test_401_mid_run_is_fatal_without_retry():
    with FaultServer() as server:
        server.faults.append("401")
        with pytest.raises(FatalBackendError, match="401"):
            make(server).chat(MSGS, GenerationParams())
    assert server.chat_requests() == 1


def test_unknown_model_lists_served_models():
    with FaultServer(models=("alpha", "beta")) as server:
        model = OpenAICompatModel("gamma", base_url=server.base_url, retry=FAST)
        with pytest.raises(FatalBackendError, match=r"'gamma' is not served.*alpha, beta"):
            model.chat(MSGS, GenerationParams())


def test_single_served_model_is_picked_when_unnamed():
    with FaultServer(models=("only-one",)) as server:
        model = load_model(server.base_url)
        model.retry = FAST  # type: ignore[attr-defined]
        c = model.chat(MSGS, GenerationParams())
    assert c.text == "42" and model.name == "only-one"


def test_unreachable_endpoint_is_one_sentence():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once we leave: nothing listens there
    model = OpenAICompatModel("m", base_url=f"http://127.0.0.1:{port}/v1", retry=FAST)
    with pytest.raises(FatalBackendError, match="cannot reach the endpoint"):
        model.chat(MSGS, GenerationParams())


def test_missing_api_key_for_openai(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(FatalBackendError, match="OPENAI_API_KEY"):
        load_model("openai:gpt-4o-mini")


def test_an_endpoint_named_by_url_never_gets_the_users_openai_key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-user-secret")
    with FaultServer(require_key="sk-user-secret") as server:
        with pytest.raises(FatalBackendError, match="API key was rejected"):
            load_model(f"{server.base_url}#fake-model").chat(MSGS, GenerationParams())
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)  # the user's own redirect
        assert load_model("openai:fake-model").chat(MSGS, GenerationParams()).text == "42"


@pytest.mark.parametrize(
    ("model", "analyst", "refused"),
    [
        ("openai:gpt-4o-mini", "anthropic:claude-sonnet-4-6", "anthropic and openai"),
        ("http://127.0.0.1:9/v1#m", "openai:gpt-4o-mini", "http://127.0.0.1:9/v1 and openai"),
        ("local", "openai:gpt-4o-mini", None),  # one place: the key goes to openai only
    ],
)
def test_one_api_key_for_two_vendors_is_refused_before_any_call(model, analyst, refused):
    from typer.testing import CliRunner

    from selftaught.cli import app

    args = ["optimize", "--task", "no-such-task", "--model", model, "--optimizer-model", analyst]
    out = CliRunner().invoke(app, [*args, "--api-key", "sk-one"])
    assert out.exit_code == 2
    if refused:
        assert f"would send it to {refused}" in out.output
    else:
        assert "would send it" not in out.output and "no-such-task" in out.output


def test_one_api_key_for_a_judge_of_another_vendor_is_refused():
    from typer.testing import CliRunner

    from selftaught.cli import app

    args = ["eval", "--task", "no-such-task", "--model", "openai:gpt-4o-mini"]
    judge = ["--judge-model", "anthropic:claude-sonnet-4-6", "--api-key", "sk-one"]
    out = CliRunner().invoke(app, [*args, *judge])
    assert out.exit_code == 2 and "would send it to anthropic and openai" in out.output


def test_eval_cli_completes_through_faults_and_reports_retries(tmp_path):
    from typer.testing import CliRunner

    from selftaught.cli import app

    def solve(messages):  # a perfect arithmetic "model"
        q = messages[-1]["content"]
        expr = re.search(r"Calculate (.*?)\.\s", q + " ").group(1)
        return str(eval(expr))  # noqa: S307 - test data from reasoning-gym only

    with FaultServer(solve) as server:
        server.faults.extend(["429", "500", "timeout", "ok", "503"])
        out = tmp_path / "eval.jsonl"
        result = CliRunner().invoke(
            app,
            [
                "eval",
                "--task",
                "gym:basic_arithmetic",
                "--model",
                f"{server.base_url}#fake-model",
                "--limit",
                "6",
                "--timeout",
                "0.5",
                "--output",
                str(out),
                "--concurrency",
                "2",
            ],
        )
    assert result.exit_code == 0, result.output
    assert "1.000" in result.output  # every example solved: faults never scored as wrong
    retries = re.search(r"retries\s+│\s+(\d+)", result.output)
    assert retries and int(retries.group(1)) == 4
    assert len(out.read_text().splitlines()) == 6


def test_eval_cli_fatal_error_is_one_sentence(tmp_path):
    from typer.testing import CliRunner

    from selftaught.cli import app

    with FaultServer(require_key="right") as server:
        result = CliRunner().invoke(
            app,
            [
                "eval",
                "--task",
                "gym:basic_arithmetic",
                "--model",
                f"{server.base_url}#fake-model",
                "--limit",
                "2",
                "--api-key",
                "wrong",
                "--output",
                str(tmp_path / "e.jsonl"),
            ],
        )
    assert result.exit_code == 1  # the backend failed (selftaught.errors)
    assert "API key was rejected" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "e.jsonl").exists()  # nothing half-written


def test_a_model_used_across_sync_calls_closes_its_client_with_each_loop():
    """Each sync call runs its own event loop; the HTTP client made in a loop is closed with
    it, so nothing is left to complain "Event loop is closed" when it is collected."""
    import gc
    import subprocess
    import sys
    import textwrap

    with FaultServer() as server:
        script = textwrap.dedent(
            f"""
            import gc
            from selftaught.models.openai_compat import OpenAICompatModel
            from selftaught.models import GenerationParams
            model = OpenAICompatModel("fake-model", base_url={server.base_url!r})
            for _ in range(3):
                model.chat({MSGS!r}, GenerationParams(max_tokens=7))
            del model
            gc.collect()
            print("done")
            """
        )
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    gc.collect()
    assert proc.returncode == 0 and "done" in proc.stdout, proc.stderr
    assert "Event loop is closed" not in proc.stderr, proc.stderr
    assert "never retrieved" not in proc.stderr, proc.stderr
