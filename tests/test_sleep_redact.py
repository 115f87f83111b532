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

from selftaught.redact import Redactor, load_extra_patterns, redact_for_model

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


# ---- a second corpus, written after the first was passing: what people actually paste -----


def pasted_secrets() -> list[tuple[str, str]]:
    """(text, the secret it holds): tokens of services the first corpus lacks, passwords in
    prose and on command lines, secrets named in prose. Random bodies, realistic shapes."""
    rng = random.Random(23)
    hexd = "0123456789abcdef"
    cases: list[tuple[str, str]] = []

    def add(template: str, secret: str) -> None:
        cases.append((template.format(s=secret), secret))

    for _ in range(2):
        slack_app = f"xapp-1-A0{rand(rng, UPPER_DIGITS, 9)}-{rng.randint(10**12, 10**13)}-"
        add("SLACK_APP_TOKEN={s}", slack_app + rand(rng, hexd, 64))
        add("socket mode needs the app-level token {s}, not the bot one", slack_app + "ab12" * 16)
        add(
            "git remote set-url origin https://oauth2:{s}@gitlab.com/acme/app.git",
            "glpat-" + rand(rng, B64URL, 20),
        )
        add("here's my gitlab PAT {s} use it for the CI", "glpat-" + rand(rng, ALNUM, 20))
        add("GROQ_API_KEY={s}", "gsk_" + rand(rng, ALNUM, 52))
        add("client = Groq(api_key='{s}')", "gsk_" + rand(rng, ALNUM, 52))
        add("export XAI_API_KEY={s}", "xai-" + rand(rng, ALNUM, 80))
        add("grok works with {s} as the key", "xai-" + rand(rng, ALNUM, 80))
        add("echo {s} | docker login -u jane --password-stdin", "dckr_pat_" + rand(rng, B64URL, 27))
        add("DOCKERHUB_TOKEN: {s}", "dckr_pat_" + rand(rng, B64URL, 27))
        sendgrid = "SG." + rand(rng, B64URL, 22) + "." + rand(rng, B64URL, 43)
        add("SENDGRID_API_KEY={s}", sendgrid)
        add("sg = SendGridAPIClient('{s}')", sendgrid[::-1][::-1])
        bot = f"{rng.randint(10**8, 10**10)}:AA{rand(rng, B64URL, 33)}"
        add("bot = telebot.TeleBot('{s}')", bot)
        add("curl https://api.telegram.org/bot{s}/sendMessage -d chat_id=42", bot)
        add("my telegram bot token is {s}", bot)
        add("redis://:{s}@cache.internal:6379/0", rand(rng, ALNUM, 18))
        add("amqps://:{s}@mq.example.com/vhost", rand(rng, ALNUM + "!*", 16))
        add("mysql -u root -p{s} prod", "S3cret_" + rand(rng, ALNUM, 6))
        add("mysqldump -uadmin -p'{s}' shop > shop.sql", "Xy9#" + rand(rng, ALNUM, 8))
        add("sshpass -p '{s}' ssh deploy@10.0.0.5", "Sup3r" + rand(rng, ALNUM, 8))
        add("sshpass -p {s} scp build.tar.gz ci@host:/srv", rand(rng, ALNUM, 12))
        add("pg_restore --password={s} -d app dump.sql", rand(rng, ALNUM + "@!", 14))
        add("curl -u admin:{s} https://jenkins.local/api/json", "Adm1n" + rand(rng, ALNUM, 6))
        add("docker login -u jane -p {s} registry.acme.io", rand(rng, ALNUM, 20))
        add("the aws secret access key is {s}", rand(rng, ALNUM + "/+", 40))
        add("AWS secret key was {s} (rotated since?)", rand(rng, ALNUM + "/+", 40))
        key_id = "AKIA" + "".join(rng.choice(UPPER_DIGITS) for _ in range(16))
        add("Access key ID,Secret access key\n" + key_id + ",{s}", rand(rng, ALNUM + "/+", 40))
        add("my storage account key is {s}", base64.b64encode(rng.randbytes(64)).decode())
        add("the api key is {s}, it's for staging", rand(rng, hexd, 32))
    for password in (
        "hunter2x!",
        "Tr0ub4dor&3",
        "Q7!mZx2p",
        "CorrectH0rse",
        "pa55word!",
        "b1u3-sky",
    ):
        add("my password is {s}", password)
    add("the pwd is {s} for the admin panel", "zX8#kd02")
    add("Password for the staging db is {s}", "St4ging!db")
    add("my wifi passphrase was '{s}'", "Blue-Sky-42")
    add("pw: {s}", "k8sAdm1n!")
    add("machine api.heroku.com login me@acme.io password {s}", rand(rng, hexd, 32))
    add("PYPI_TOKEN={s}", "pypi-AgEIcHlwaS5vcmc" + rand(rng, B64URL, 60))
    add("DIGITALOCEAN_TOKEN={s}", "dop_v1_" + rand(rng, hexd, 64))
    add("shopify admin token {s}", "shpat_" + rand(rng, hexd, 32))
    add("SENTRY_DSN=https://{s}@o4504.ingest.sentry.io/4505", rand(rng, hexd, 32))
    add("LINEAR_API_KEY={s}", "lin_api_" + rand(rng, ALNUM, 40))
    add("REPLICATE_API_TOKEN={s}", "r8_" + rand(rng, ALNUM, 37))
    add("use the OpenRouter key {s}", "sk-or-v1-" + rand(rng, hexd, 64))
    add("deepseek: {s}", "sk-" + rand(rng, hexd, 32))
    add(
        "curl -H 'x-api-key: {s}' https://api.anthropic.com",
        "sk-ant-api03-" + rand(rng, B64URL, 95),
    )
    add("HF_TOKEN={s} python train.py", "hf_" + rand(rng, ALNUM, 34))
    add(
        "DefaultEndpointsProtocol=https;AccountName=acme;AccountKey={s};EndpointSuffix=core",
        base64.b64encode(rng.randbytes(64)).decode(),
    )
    add("jdbc:postgresql://db:5432/app?user=app&password={s}", "J" + rand(rng, ALNUM, 11))
    add("set PGPASSWORD={s} && psql -h db -U app", "Pg_" + rand(rng, ALNUM, 9))
    add("STRIPE_WEBHOOK_SECRET=whsec_{s}", rand(rng, ALNUM, 32))
    return cases


def technical_text() -> list[str]:
    """Secret-free text of the kinds engineers write every day, many of them near misses
    (a name that says pass/secret/token/key with an ordinary value)."""
    rng = random.Random(29)
    texts = [
        "n_pass = 1024",
        "first_pass = 0.731",
        "the secret: practice daily",
        "route traffic to sk-pool-east-2 while sk-pool-west-1 drains",
        "num_passes = 3  # compiler passes",
        "second_pass: true",
        "compile_pass = 2",
        "bypass_cache = True",
        "password_hash = bcrypt.hashpw(raw, salt)",
        "The password field is required.",
        "Forgot your password? Click here to reset it.",
        "password: str = Field(..., min_length=8)",
        "echo $TOKEN | docker login --username jane --password-stdin",
        "PASSWORD_MIN_LENGTH = 12",
        "self.password = password",
        "db_password = new_password",
        "if password != confirm_password: raise ValueError",
        "secret_santa = assign(people)",
        "token = secrets.token_hex(16)",
        "kubectl get secrets -n prod",
        "kubectl create secret generic db-creds --from-file=./creds",
        "token_type_ids = inputs['token_type_ids']",
        "max_new_tokens: 256",
        "tokenizer.pad_token = tokenizer.eos_token",
        "eos_token_id=2, bos_token: <s>",
        "api_key = os.environ['OPENAI_API_KEY']",
        "api_key=settings.OPENAI_API_KEY",
        "Authorization: Bearer ${OPENAI_API_KEY}",
        "the API key is missing; set OPENAI_API_KEY",
        "your access token has expired, log in again",
        "the token is invalid or expired",
        "the key is to batch requests",
        "the secret is consistency, not talent",
        "mysql -u root -p mydb",
        "mysql -h db.internal -P 3306 -u app -p",
        "ssh -p 2222 deploy@10.0.0.5",
        "python -m pytest -p no:cacheprovider -q",
        "curl -u $USER:$PASS https://example.com",
        "cd $(pwd)/build && make",
        "the pwd is /home/jane/src",
        "first_pass_rate: 0.42",
        "use_password_auth: false",
        "PASSWORD_RESET_TIMEOUT = 3600",
        "model: gpt-4o-mini-2024-07-18",
        "https://user@github.com/acme/repo.git",
        "ssh://git@gitlab.com:2222/acme/app.git",
        "http://localhost:8080/@admin",
        "xoxo-thanks-for-the-help-everyone",
        "the gsk_ prefix is Groq's; glpat- is GitLab's",
        "grok via the xai-grok-2-1212 model",
        "ratio 16:9 at 12:34:56",
        "error 1234567:AA at offset 9",
        "SG.1 regulation applies",
        "ghp_ means a classic personal access token",
        "IAM access keys start with AKIA",
        "Passwords must contain a digit and a symbol.",
        "sk-learn style estimators: fit / predict",
        "xai-sdk==1.0.2 and groq==0.9.0 in requirements.txt",
        "the secret sauce: caching",
        "my password manager is 1Password",
    ]
    for _ in range(3):
        sha = hashlib.sha256(rng.randbytes(16)).hexdigest()
        texts += [
            f"integrity: sha512-{base64.b64encode(rng.randbytes(64)).decode()}",
            f"run id run-{rng.randint(10**7, 10**8)}-{sha[:12]}",
            f"cache_key = f'user:{{uid}}:{sha[:8]}'",
            f"layer_{rng.randint(0, 40)}.pass_through = identity",
        ]
    return texts


def test_pasted_secrets_are_redacted_and_technical_text_is_not():
    redactor = Redactor()
    secrets_ = pasted_secrets()
    clean = technical_text()
    assert len(secrets_) >= 60 and len(clean) >= 60
    missed = [(t, out) for t, s in secrets_ if s in (out := redactor.redact(t)[0])]
    flagged = [(t, out) for t in clean if (out := redactor.redact(t)[0]) != t]
    recall = 1 - len(missed) / len(secrets_)
    fp_rate = len(flagged) / len(clean)
    print(
        f"\nrecall {recall:.1%} of {len(secrets_)}, false positives {fp_rate:.1%} of {len(clean)}"
    )
    assert recall >= 0.98, missed
    assert fp_rate <= 0.03, flagged


@pytest.mark.parametrize(
    "text",
    [
        "n_pass = 1024",
        "first_pass = 0.731",
        "the secret: practice daily",
        "route traffic to sk-pool-east-2 while sk-pool-west-1-replica drains",
        "self.password = password",
        "if password != confirm_password: raise ValueError",
    ],
)
def test_the_reported_false_positives_stay(text):
    assert Redactor().redact(text) == (text, 0)


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("SLACK_APP_TOKEN=xapp-1-A05AB12CD34-5512345678901-" + "a1b2" * 16, "a1b2a1b2"),
        ("token glpat-Xy12ab34Cd56ef78Gh90", "glpat-Xy12ab34Cd56ef78Gh90"),
        ("GROQ=gsk_" + "Ab3d" * 13, "gsk_Ab3d"),
        ("key xai-" + "Qw8e" * 20, "xai-Qw8e"),
        ("dckr_pat_Zx9cVb8nM7aS6dF5gH4jK3l2", "dckr_pat_Zx9c"),
        ("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", "SG.ab12"),
        ("bot 123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw", "AAHdqTcvCH1vGWJx"),
        ("https://:hunter2pw@proxy.corp:3128", "hunter2pw"),
        ("my password is hunter2x!", "hunter2x"),
        ("the pwd is Tr0ub4dor&3", "Tr0ub4dor"),
        ("mysql -u root -pS3cret prod", "S3cret"),
        ("sshpass -p 'x7Kq!pw' ssh host", "x7Kq!pw"),
        ("psql --password=P4ss!word", "P4ss!word"),
        ("aws secret access key is wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLE12", "wJalrXUtnFEMI"),
    ],
)
def test_each_reported_family_is_caught(text, secret):
    out, n = Redactor().redact(text)
    assert secret not in out and n >= 1, out
