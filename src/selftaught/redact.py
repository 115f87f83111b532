"""Secrets out of logged text: before anything is stored, and before logged text is sent to an
optimizer or judge model (`redact_for_model`).

A table of patterns, each with a name and the group that holds the secret: vendor keys with a
distinctive prefix (OpenAI, Anthropic, AWS, GitHub, GitLab, Slack, Google, Stripe, Hugging Face,
npm, PyPI, Groq, xAI, Docker, SendGrid, Telegram bots, DigitalOcean, Shopify, ...), bearer /
basic credentials, JWTs, private-key blocks, passwords (and tokens) in URLs, `name = value`
pairs whose name says secret (`password=`, `secret:`, `"api_key": "..."`,
`AWS_SECRET_ACCESS_KEY=`), the same said in prose ("my password is ...", "the aws secret
access key is ..."), and passwords on command lines (`mysql -p...`, `sshpass -p`, `curl -u`).
A value must look like its kind: a name such as `n_pass` or `secret` in prose needs a value
with more than plain words or numbers (`n_pass = 1024`, "the secret: practice daily" stay),
and an unquoted code reference (`password = self.password`) is left alone.
A secret becomes `[REDACTED:<name>]`; redacting twice changes nothing. Extra patterns come from
the caller (`--redact-pattern`) or from `<home>/redact_patterns.txt` (one regex per line; the
whole match, or group 1 when there is one, is redacted).

Deliberately left alone: bare high-entropy strings (git hashes, sha256, UUIDs, base64 data),
because they are what code is full of; a secret without a known prefix or a telling name is
missed. `tests/test_sleep_redact.py` measures both sides on a corpus.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from selftaught.errors import ConfigError
from selftaught.runs import sleep_home

MARK = "[REDACTED:{}]"
_ALREADY = r"(?!\[REDACTED)"  # never redact a marker again

# Names (of variables, keys, flags) whose value is a secret whatever it looks like...
_STRONG_PASSWORD_NAMES = r"passw(?:or)?d|passwd|passphrase"
# ...and names that also name ordinary things (`n_pass`, "the secret: ..."): the value must
# look like a password too.
_WEAK_PASSWORD_NAMES = r"secret|client[_-]?secret|[_-]pass|[_-]pwd"
_PASSWORD_NAMES = _STRONG_PASSWORD_NAMES + "|" + _WEAK_PASSWORD_NAMES
# Names whose value is a secret when it also looks like one (long, letters and digits), so that
# `max_tokens=256` or `tokenizer = AutoTokenizer` stay.
_KEY_NAMES = (
    r"api[_-]?key|apikey|access[_-]?key(?:[_-]?id)?|secret[_-]?access[_-]?key|secret[_-]?key|"
    r"private[_-]?key|auth[_-]?token|access[_-]?token|refresh[_-]?token|session[_-]?token|"
    r"id[_-]?token|token|account[_-]?key|shared[_-]?access[_-]?key|credentials?|signing[_-]?key|"
    r"encryption[_-]?key|webhook[_-]?secret|bot[_-]?token"
)
# A value: quoted (anything up to the closing quote) or bare (up to a separator).
_VALUE = r"""(?:"([^"\n]{1,400})"|'([^'\n]{1,400})'|([^\s"',;)}\]<>]{1,400}))"""
_NOT_A_SECRET = re.compile(
    r"^(?:true|false|null|none|nil|undefined|required|optional|string|str|int|bytes|"
    r"raise|return|continue|break|await|yield|lambda|not|and|or|in|is|if|else|then|do|"
    r"\*+|x+|\.\.\.|<[^>]*>|\$\{?[A-Za-z_][\w]*\}?|%\(?\w*\)?s?|\{\{?[^}]*\}\}?|"
    r"(?:os\.)?(?:environ|getenv)\b.*|process\.env\b.*|env\(.*|[A-Za-z_][\w.]*\(.*)$",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Pattern:
    """One kind of secret. `group` is the capture group holding the secret (0: whole match);
    `check` (optional) must accept the secret, for patterns that need more than a regex."""

    name: str
    regex: re.Pattern[str]
    group: int | tuple[int, ...] = 0
    check: Any = None


def _looks_random(value: str) -> bool:
    """Long enough, with letters and digits: a token rather than a word or a number."""
    return (
        len(value) >= 12
        and any(c.isdigit() for c in value)
        and any(c.isalpha() for c in value)
        and not _NOT_A_SECRET.match(value)
    )


def _is_password(value: str) -> bool:
    return len(value) >= 3 and not _NOT_A_SECRET.match(value) and not _code_reference(value)


_CODE_REFERENCE = re.compile(
    r"^(?:[A-Za-z_]+(?:\.[A-Za-z_]+)+|[a-z]+(?:_[a-z]+)+|"
    r"(?:passw(?:or)?d|passwd|pwd|pass|secret|passphrase|token|key))$",
    re.IGNORECASE,
)


def _code_reference(value: str) -> bool:
    """`self.password`, `new_password`, `password`: a variable, not a value (bare values only:
    a quoted `'new_password'` is a literal and stays a secret)."""
    return bool(_CODE_REFERENCE.match(value))


def _looks_like_password(value: str) -> bool:
    """A password rather than a word, a number or a path: letters with digits, symbols or
    inner capitals, at least 6 characters."""
    value = value.rstrip(".,;:)")
    if len(value) < 6 or _NOT_A_SECRET.match(value) or _code_reference(value):
        return False
    if value[0] in "/~." or "://" in value:
        return False
    letters = any(c.isalpha() for c in value)
    digits = any(c.isdigit() for c in value)
    symbols = any(not c.isalnum() for c in value)
    inner_capitals = any(c.isupper() for c in value[1:]) and any(c.islower() for c in value)
    return letters and (digits or symbols or inner_capitals)


def _is_weak_named_password(value: str) -> bool:
    """For `[_-]pass` / `secret` names: not a number (`n_pass = 1024`), and when it is a
    plain word, not prose ("the secret: practice daily")."""
    if not _is_password(value) or not any(c.isalpha() for c in value):
        return False
    return _looks_like_password(value) or len(value) >= 12


def _has_key_segment(value: str) -> bool:
    """A key body holds a long random run (`sk-` + 48 characters); a name such as
    `sk-pool-east-2` is short words between dashes."""
    return any(
        len(part) >= 12 and any(c.isdigit() for c in part) and any(c.isalpha() for c in part)
        for part in re.split(r"[-_]", value)
    )


def _has_digit(value: str) -> bool:
    return any(c.isdigit() for c in value)


def _p(name: str, regex: str, group: int | tuple[int, ...] = 0, check: Any = None) -> Pattern:
    return Pattern(name, re.compile(regex), group, check)


_EDGE = r"(?<![A-Za-z0-9_\-])"  # start of a token
_END = r"(?![A-Za-z0-9_\-])"

# A value said in prose: "is", "was", ":" or "=" after the name, maybe quoted.
_PROSE_IS = r"\s*(?:\bis\b|\bwas\b|:|=)\s*(?:[:=]\s*)?[`'\"]?"
_PROSE_VALUE = r"([^\s`'\"]{3,200})"


def _prefixed(name: str, regex: str, check: Any = None) -> Pattern:
    """A vendor token: a distinctive prefix, at a token's edges."""
    return _p(name, _EDGE + regex + _END, 0, check)


BUILTIN_PATTERNS: tuple[Pattern, ...] = (
    _p(
        "private_key",
        r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----[\s\S]*?"
        r"(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|\Z)",
    ),
    _prefixed("anthropic_key", r"sk-ant-[A-Za-z0-9_\-]{20,}"),
    # sk-, sk-proj-, sk-svcacct-, sk-admin-, sk-or-v1- (OpenRouter), DeepSeek's sk-<hex>
    _prefixed("openai_key", r"sk-[A-Za-z0-9_\-]{20,}", _has_key_segment),
    # the console's CSV and pasted pairs: the key id, then its secret (before
    # the id is redacted)
    _p(
        "aws_secret_key",
        r"\b(?:AKIA|ASIA)[0-9A-Z]{16}['\"]?[\s,;:|]+['\"]?([A-Za-z0-9/+]{40})(?![A-Za-z0-9/+])",
        1,
    ),
    _p("aws_access_key_id", r"\b(?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AROA)[0-9A-Z]{16}\b"),
    _p(
        "aws_secret_key",
        r"(?i)(?:aws|amazon)[\w\-. ]{0,30}?(?:secret|private)[\w\-. ]{0,20}?"
        r"(?:['\"]?\s*[:=]\s*['\"]?|\s+(?:is|was)\s*:?\s*['\"`]?)"
        r"([A-Za-z0-9/+]{40})(?![A-Za-z0-9/+])",
        1,
    ),
    _p("github_token", r"\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{30,}\b"),
    _p("github_token", r"\bgithub_pat_[A-Za-z0-9_]{22,}\b"),
    _prefixed("gitlab_token", r"gl(?:pat|dt|rt|ptt|cbt|oas|soat|ft|imt|agent)-[A-Za-z0-9_\-]{20,}"),
    _p("slack_token", r"\bxox[abposre]-[A-Za-z0-9\-]{10,}", 0, _has_digit),
    _prefixed("slack_token", r"xapp-\d-[A-Za-z0-9\-]{20,}"),
    _p(
        "slack_webhook",
        r"https://hooks\.slack\.com/(?:services|workflows)/[A-Za-z0-9_/\-]{20,}",
    ),
    _p("google_api_key", r"\bAIza[0-9A-Za-z_\-]{35}" + _END),
    _p("google_oauth_token", r"\bya29\.[0-9A-Za-z_\-]{20,}"),
    _p("stripe_key", r"\b(?:sk|rk|pk|whsec)_(?:live|test)_[0-9A-Za-z]{16,}\b"),
    _p("stripe_key", r"\bwhsec_[0-9A-Za-z]{24,}\b"),
    _p("huggingface_token", r"\bhf_[A-Za-z0-9]{30,}\b"),
    _p("npm_token", r"\bnpm_[A-Za-z0-9]{36}\b"),
    _prefixed("pypi_token", r"pypi-AgE[A-Za-z0-9_\-]{50,}"),
    _prefixed("groq_key", r"gsk_[A-Za-z0-9]{20,}"),
    _prefixed("xai_key", r"xai-[A-Za-z0-9]{20,}"),
    _prefixed("docker_token", r"dckr_(?:pat|oat)_[A-Za-z0-9_\-]{20,}"),
    _prefixed("sendgrid_key", r"SG\.[A-Za-z0-9_\-]{16,}\.[A-Za-z0-9_\-]{16,}"),
    _p(  # also inside a bot API URL: /bot<token>/sendMessage
        "telegram_bot_token",
        r"(?:(?<=/bot)|(?<![A-Za-z0-9]))\d{6,12}:AA[A-Za-z0-9_\-]{30,}" + _END,
    ),
    _prefixed("digitalocean_token", r"do[opr]_v1_[a-f0-9]{64}"),
    _prefixed("shopify_token", r"shp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}"),
    _prefixed(
        "vendor_token",
        r"(?:lin_api_[A-Za-z0-9]{30,}|r8_[A-Za-z0-9]{30,}|pplx-[A-Za-z0-9]{40,}|"
        r"ntn_[A-Za-z0-9]{30,}|dapi[a-f0-9]{32}|key-[a-f0-9]{32}|NRAK-[A-Z0-9]{27}|"
        r"ATATT3[A-Za-z0-9_\-=]{50,}|glsa_[A-Za-z0-9_]{32,}|sntrys_[A-Za-z0-9_=+/]{40,})",
    ),
    _p(
        "jwt",
        r"\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",
    ),
    _p(
        "bearer_token",
        r"(?i)\b(?:bearer|token)\s+" + _ALREADY + r"([A-Za-z0-9\-._~+/]{16,}=*)",
        1,
        _looks_random,
    ),
    _p(
        "basic_auth",
        r"(?i)\bauthorization\s*[:=]\s*['\"]?basic\s+" + _ALREADY + r"([A-Za-z0-9+/]{8,}=*)",
        1,
    ),
    # scheme://user:password@ and scheme://:password@. The password runs to the last `@`
    # (within 200 characters): it may hold `/`, `?`, `#` or `@`; a port followed by a path
    # (host:8080/path?mail=a@b) is no password.
    _p(
        "url_password",
        r"\b[A-Za-z][A-Za-z0-9+.\-]{1,20}://[^\s:/@\"'<>\[\]]{0,100}:"
        + _ALREADY
        + r"(?!\d{1,5}[/?#])([^\s\"'<>]{1,200})@",
        1,
    ),
    # scheme://TOKEN@host (a Sentry DSN, a token used as the user name)
    _p(
        "url_token",
        r"\b[A-Za-z][A-Za-z0-9+.\-]{1,20}://" + _ALREADY + r"([A-Za-z0-9_\-]{16,200})@",
        1,
        _looks_random,
    ),
    _p(
        "password",
        r"(?i)(?<![A-Za-z0-9])[A-Za-z0-9_.\-]{0,40}?(?:" + _STRONG_PASSWORD_NAMES + r")['\"]?"
        r"\s*(?:[:=]|=>|:=)\s*" + _ALREADY + _VALUE,
        (1, 2, 3),
        _is_password,
    ),
    _p(
        "password",
        r"(?i)(?<![A-Za-z0-9])[A-Za-z0-9_.\-]{0,40}?(?:" + _WEAK_PASSWORD_NAMES + r")['\"]?"
        r"\s*(?:[:=]|=>|:=)\s*" + _ALREADY + _VALUE,
        (1, 2, 3),
        _is_weak_named_password,
    ),
    # prose: "my password is hunter2x!", "the pwd for staging was ..."
    _p(
        "password",
        r"(?i)\b(?:pass(?:word|wd|phrase|code)|pwd|pw)\b(?:\s+(?:for|of|to|on)\s+[^\n:=]{1,40}?)?"
        + _PROSE_IS
        + _ALREADY
        + _PROSE_VALUE,
        1,
        _looks_like_password,
    ),
    # .netrc: machine HOST login USER password PASS
    _p("password", r"(?i)\bmachine\s+\S+\s+login\s+\S+\s+password\s+" + _ALREADY + r"(\S+)", 1),
    _p(
        "secret_value",
        r"(?i)(?<![A-Za-z0-9])[A-Za-z0-9_.\-]{0,40}?(?:" + _KEY_NAMES + r")['\"]?"
        r"\s*(?:[:=]|=>|:=)\s*" + _ALREADY + _VALUE,
        (1, 2, 3),
        _looks_random,
    ),
    # prose: "the api key is ...", "my storage account key: ..."
    _p(
        "secret_value",
        r"(?i)\b(?:api|access|secret|account|storage|private|signing|encryption|master|license)"
        r"[ _-]?(?:access[ _-]?)?key\b" + _PROSE_IS + _ALREADY + _PROSE_VALUE,
        1,
        _looks_random,
    ),
    _p(
        "secret_value",
        r"(?i)\b(?:(?:api|auth|access|bearer|refresh|bot|session|personal[ _-]access)[ _-]?)?"
        r"token\b" + _PROSE_IS + _ALREADY + _PROSE_VALUE,
        1,
        _looks_random,
    ),
    _p(
        "cli_secret_flag",
        r"(?i)--(?:password|passwd|api-key|token|secret|access-key|client-secret|auth-token)"
        r"(?:\s+|=)" + _ALREADY + r"(?:'([^'\n]{3,})'|\"([^\"\n]{3,})\"|([^\s\"']{3,}))",
        (1, 2, 3),
    ),
    # mysql -pSECRET (no space: with one, -p prompts and the word is the database)
    _p(
        "cli_password",
        r"\b(?:mysql|mysqldump|mysqladmin|mariadb|mariadb-dump|mysqlimport|mysqlsh)\b"
        r"[^\n|;&]*?\s-p" + _ALREADY + r"(?:'([^'\n]+)'|\"([^\"\n]+)\"|([^\s'\"]+))",
        (1, 2, 3),
    ),
    # sshpass -p SECRET, docker login -p SECRET, curl -u user:SECRET
    _p(
        "cli_password",
        r"\b(?:sshpass|docker\s+login|podman\s+login|helm\s+registry\s+login)\b[^\n|;&]*?"
        r"\s-p\s*" + _ALREADY + r"(?:'([^'\n]+)'|\"([^\"\n]+)\"|([^\s'\"]+))",
        (1, 2, 3),
        _is_password,
    ),
    _p(
        "cli_password",
        r"\bcurl\b[^\n|;&]*?\s(?:-u|--user)\s*['\"]?[^\s:'\"]+:" + _ALREADY + r"([^\s'\"]+)",
        1,
        _is_password,
    ),
)


def load_extra_patterns(path: str | Path | None = None) -> list[str]:
    """Regexes from `<home>/redact_patterns.txt` (or `path`): one per line, `#` comments."""
    file = Path(path) if path else sleep_home() / "redact_patterns.txt"
    if not file.is_file():
        return []
    lines = file.read_text(encoding="utf-8").splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]


@dataclass
class Redactor:
    """Applies the built-in table plus `extra_patterns` (regex strings; group 1 when present)."""

    extra_patterns: Sequence[str] = ()
    patterns: list[Pattern] = field(init=False)

    def __post_init__(self) -> None:
        extra: list[Pattern] = []
        for i, regex in enumerate(self.extra_patterns):
            try:
                compiled = re.compile(regex)
            except re.error as err:
                raise ConfigError(
                    f"redaction pattern {i + 1} ({regex!r}) is invalid: {err}"
                ) from err
            extra.append(Pattern("custom", compiled, 1 if compiled.groups else 0))
        self.patterns = list(BUILTIN_PATTERNS) + extra

    def redact(self, text: str) -> tuple[str, int]:
        """`text` with every secret replaced, and how many were."""
        total = 0
        for pattern in self.patterns:
            text, n = _apply(pattern, text)
            total += n
        return text, total

    def redact_value(self, value: Any) -> tuple[Any, int]:
        """Redact every string inside a JSON-like value (dicts, lists); keys are kept."""
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, list):
            out, total = [], 0
            for item in value:
                red, n = self.redact_value(item)
                out.append(red)
                total += n
            return out, total
        if isinstance(value, dict):
            result: dict[Any, Any] = {}
            total = 0
            for key, item in value.items():
                if isinstance(item, str) and _secret_field(key, item):
                    result[key] = MARK.format("secret_value")
                    total += 1
                    continue
                red, n = self.redact_value(item)
                result[key] = red
                total += n
            return result, total
        return value, 0


# Only names ending in the keyword: `tokens`, `max_tokens`, `token_count` are not secrets.
_PASSWORD_KEY = re.compile(r"(?i)^[A-Za-z0-9_.\-]*(?:" + _PASSWORD_NAMES + r")$|^authorization$")
_TOKEN_KEY = re.compile(r"(?i)^[A-Za-z0-9_.\-]*(?:" + _KEY_NAMES + r")$")


def _secret_field(key: Any, value: str) -> bool:
    """A JSON field whose name says its value is a secret, and whose value fits."""
    if not isinstance(key, str) or value.startswith("[REDACTED"):
        return False
    if _PASSWORD_KEY.match(key):
        return _is_password(value)
    return bool(_TOKEN_KEY.match(key)) and _looks_random(value)


def _apply(pattern: Pattern, text: str) -> tuple[str, int]:
    count = 0

    def replace(m: re.Match[str]) -> str:
        nonlocal count
        groups = pattern.group if isinstance(pattern.group, tuple) else (pattern.group,)
        for g in groups:
            secret = m.group(g)
            if secret is None:
                continue
            if secret.startswith("[REDACTED") or (pattern.check and not pattern.check(secret)):
                return m.group(0)
            count += 1
            start, end = m.start(g) - m.start(0), m.end(g) - m.start(0)
            whole = m.group(0)
            return whole[:start] + MARK.format(pattern.name) + whole[end:]
        return m.group(0)

    return pattern.regex.sub(replace, text), count


_default: Redactor | None = None


def default_redactor() -> Redactor:
    """The built-in table plus `<home>/redact_patterns.txt` (read once per process)."""
    global _default
    if _default is None:
        _default = Redactor(load_extra_patterns())
    return _default


def redact_text(text: str, extra_patterns: Iterable[str] = ()) -> tuple[str, int]:
    extra = list(extra_patterns)
    redactor = Redactor(list(default_redactor().extra_patterns) + extra) if extra else None
    return (redactor or default_redactor()).redact(text)


def redact_for_model(text: str) -> str:
    """What part 2 calls on logged text before it goes to an optimizer or judge model."""
    return default_redactor().redact(text)[0]
