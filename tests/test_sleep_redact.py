"""Redaction on a corpus: realistic secrets embedded in text are all redacted; secret-free
technical strings (hashes, UUIDs, base64 data, identifiers) are mostly left alone, and the
false-positive rate is measured and printed."""

from __future__ import annotations

import base64
import hashlib
import random
import string
import uuid

import pytest

from selftaught.sleep.redact import Redactor, load_extra_patterns, redact_for_model

ALNUM = string.ascii_letters + string.digits
UPPER_DIGITS = string.ascii_uppercase + string.digits
B64URL = ALNUM + "-_"


def rand(rng: random.Random, alphabet: str, n: int) -> str:
    # at least one digit and one letter, as real keys have
    body = [rng.choice(alphabet) for _ in range(n - 2)]
    return "".join(body) + rng.choice(string.digits) + rng.choice(string.ascii_letters)


def b64(rng: random.Random, n: int) -> str:
    return base64.urlsafe_b64encode(rng.randbytes(n)).decode().rstrip("=")


def jwt(rng: random.Random) -> str:
    header = base64.urlsafe_b64encode(b'{"alg":"HS256","typ":"JWT"}').decode().rstrip("=")
    payload = base64.urlsafe_b64encode(
        f'{{"sub":"{rng.randint(1, 10**6)}","name":"Jane","iat":1516239022}}'.encode()
    )
    return f"{header}.{payload.decode().rstrip('=')}.{b64(rng, 32)}"


def secrets_corpus() -> list[tuple[str, str]]:
    """(text, the secret it holds): 60 cases over every kind the issue names."""
    rng = random.Random(7)
    cases: list[tuple[str, str]] = []

    def add(template: str, secret: str) -> None:
        cases.append((template.format(s=secret), secret))

    for _ in range(3):
        key = "sk-" + rand(rng, ALNUM, 48)
        add("my openai key is {s} please don't share", key)
        add("export OPENAI_API_KEY={s}", "sk-proj-" + rand(rng, B64URL, 120))
        add('client = OpenAI(api_key="{s}")', "sk-svcacct-" + rand(rng, B64URL, 60))
        add("ANTHROPIC_API_KEY={s}\nMODEL=claude", "sk-ant-api03-" + rand(rng, B64URL, 93) + "AA")
        add("anthropic.Anthropic(api_key='{s}')", "sk-ant-admin01-" + rand(rng, B64URL, 80))
        add("aws configure set aws_access_key_id {s}", "AKIA" + rand(rng, UPPER_DIGITS, 16))
        add(
            "[default]\naws_secret_access_key = {s}\nregion = eu-west-1",
            rand(rng, ALNUM + "/+", 40),
        )
        add("git clone https://{s}@github.com/acme/private.git", "ghp_" + rand(rng, ALNUM, 36))
        add("GH_TOKEN={s} gh pr list", "github_pat_" + rand(rng, ALNUM + "_", 82))
        add("token: {s}", "gho_" + rand(rng, ALNUM, 36))
        add(
            "SLACK_BOT_TOKEN={s}",
            "xoxb-"
            + "-".join(rand(rng, string.digits, 12) for _ in range(2))
            + "-"
            + rand(rng, ALNUM, 24),
        )
        add(
            "const url = 'https://maps.googleapis.com/maps/api?key={s}'",
            "AIza" + rand(rng, B64URL, 35),
        )
        add("curl -H 'Authorization: Bearer {s}' https://api.example.com/v1", b64(rng, 30))
        add("Authorization: Bearer {s}", jwt(rng))
        add("the session cookie was {s} (expired?)", jwt(rng))
        add("DATABASE_URL=postgres://admin:{s}@db.internal:5432/app", rand(rng, ALNUM, 16))
        add("redis://default:{s}@cache:6379/0", rand(rng, ALNUM + "!*", 20))
        add("db_password={s}", rand(rng, ALNUM + "#!", 12))
        add('{{"username": "svc", "password": "{s}"}}', rand(rng, ALNUM, 14))
        add("  client_secret: {s}\n  tenant: acme", rand(rng, ALNUM + "~.", 34))

    # a few one-offs
    pem_body = "\n".join(base64.b64encode(rng.randbytes(48)).decode() for _ in range(6))
    add(
        "here is the deploy key:\n{s}\nthanks",
        f"-----BEGIN RSA PRIVATE KEY-----\n{pem_body}\n-----END RSA PRIVATE KEY-----",
    )
    add(
        "{s}", f"-----BEGIN OPENSSH PRIVATE KEY-----\n{pem_body}\n-----END OPENSSH PRIVATE KEY-----"
    )
    add("mysql -u root --password={s} prod", "Tr0ub4dor&3")
    add("SECRET_KEY = '{s}'  # django", rand(rng, ALNUM + "!@#%^", 50))
    add("STRIPE_KEY={s}", "sk_live_" + rand(rng, ALNUM, 24))
    add("huggingface-cli login --token {s}", "hf_" + rand(rng, ALNUM, 34))
    add("//registry.npmjs.org/:_authToken={s}", "npm_" + rand(rng, ALNUM, 36))
    add(
        "webhook: {s}",
        "https://hooks.slack.com/services/T0"
        + rand(rng, UPPER_DIGITS, 8)
        + "/B0"
        + rand(rng, UPPER_DIGITS, 8)
        + "/"
        + rand(rng, ALNUM, 24),
    )
    return cases


def clean_corpus() -> list[str]:
    """Secret-free technical strings that look random: 70 cases."""
    rng = random.Random(11)
    texts: list[str] = []
    for _ in range(10):
        sha1 = hashlib.sha1(rng.randbytes(16)).hexdigest()
        sha256 = hashlib.sha256(rng.randbytes(16)).hexdigest()
        u = uuid.UUID(int=rng.getrandbits(128), version=4)
        png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + rng.randbytes(300)).decode()
        texts += [
            f"commit {sha1}\nAuthor: Jane <jane@example.com>",
            f'EXPECTED_SHA256 = "{sha256}"',
            f"request id {u} failed with 500",
            f'<img src="data:image/png;base64,{png}"/>',
            f"git checkout {sha1[:12]} && pytest tests/test_{rng.randint(1, 99)}.py",
            f"layers.{rng.randint(0, 23)}.self_attn.q_proj.lora_A.weight: shape [16, 576]",
            f"max_tokens={rng.randint(16, 4096)}, temperature=0.7, "
            f"token_count: {rng.randint(1, 99)}",
            f"docker pull ghcr.io/acme/app@sha256:{sha256}",
            f"AbstractSingletonProxyFactoryBean{rng.randint(100, 999)}HandlerInterceptorAdapter",
            f"see https://github.com/acme/repo/blob/{sha1}/src/main.py#L{rng.randint(1, 500)}",
        ]
    texts += [
        "tokenizer = AutoTokenizer.from_pretrained(path)",
        "password = getpass.getpass()",
        "api_key = os.environ['OPENAI_API_KEY']",
        "The password must be at least 12 characters.",
        "Bearer of bad news: the build is red.",
        "sk-learn style estimators: fit / predict",
        "task-runner-v2 finished; secret_count: 0",
        "export PWD=/home/jane/src",
        "use the token limit, not the tokens per second",
        "postgres://localhost:5432/app",
    ]
    return texts


def test_every_secret_in_the_corpus_is_redacted():
    redactor = Redactor()
    corpus = secrets_corpus()
    assert len(corpus) >= 50
    missed = []
    for text, secret in corpus:
        out, n = redactor.redact(text)
        if secret in out or n < 1:
            missed.append((text, out))
        assert "[REDACTED:[REDACTED" not in out, out  # a marker is never redacted again
    assert not missed, f"{len(missed)} secrets leaked, first: {missed[0]}"
    print(f"\nredacted {len(corpus)}/{len(corpus)} secrets (100%)")


def test_false_positive_rate_on_secret_free_strings_is_low():
    redactor = Redactor()
    clean = clean_corpus()
    assert len(clean) >= 50
    flagged = [(t, redactor.redact(t)[0]) for t in clean if redactor.redact(t)[1]]
    rate = len(flagged) / len(clean)
    print(f"\nfalse positives: {len(flagged)}/{len(clean)} = {rate:.1%}")
    for text, out in flagged:
        print("  ", text[:80], "->", out[:80])
    assert rate <= 0.05


def test_redaction_is_idempotent_and_counts():
    redactor = Redactor()
    text = "key sk-" + "a1" * 20 + " and password: hunter22 and AKIAABCDEFGHIJKLMNOP"
    once, n1 = redactor.redact(text)
    twice, n2 = redactor.redact(once)
    assert n1 == 3 and n2 == 0 and once == twice
    assert "hunter22" not in once and "[REDACTED:password]" in once


def test_redact_value_walks_json_and_secret_named_fields():
    redactor = Redactor()
    value = {
        "messages": [{"role": "user", "content": "my key is ghp_" + "x1" * 18}],
        "headers": {"Authorization": "Bearer abc", "max_tokens": 256},
        "api_key": "k3y-" + "9z" * 10,
        "tokens": "12345678901234",
    }
    out, n = redactor.redact_value(value)
    assert n == 3
    assert out["headers"]["Authorization"] == "[REDACTED:secret_value]"
    assert out["api_key"] == "[REDACTED:secret_value]"
    assert out["headers"]["max_tokens"] == 256 and out["tokens"] == "12345678901234"
    assert "ghp_" not in out["messages"][0]["content"]


def test_extra_patterns_from_the_caller_and_the_home_file(tmp_path, monkeypatch):
    redactor = Redactor([r"ACME-[0-9]{6}", r"employee id (\d+)"])
    out, n = redactor.redact("ticket ACME-123456 for employee id 4711")
    assert n == 2 and out == "ticket [REDACTED:custom] for employee id [REDACTED:custom]"
    with pytest.raises(ValueError, match="pattern 1"):
        Redactor(["(unclosed"])
    (tmp_path / "redact_patterns.txt").write_text("# comment\nINTERNAL-\\w+\n\n")
    monkeypatch.setenv("SELFTAUGHT_HOME", str(tmp_path))
    assert load_extra_patterns() == ["INTERNAL-\\w+"]


def test_redact_for_model_uses_the_default_table():
    assert "sk-ant-" not in redact_for_model("use sk-ant-api03-" + "Ab1" * 30)
