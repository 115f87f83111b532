"""Secrets out of logged text: before anything is stored, and before logged text is sent to an
optimizer or judge model (`redact_for_model`).

A table of patterns, each with a name and the group that holds the secret: vendor keys with a
distinctive prefix (OpenAI, Anthropic, AWS, GitHub, GitLab, Slack, Google, Stripe, Hugging Face,
npm, PyPI, Groq, xAI, Docker, SendGrid, Telegram bots, DigitalOcean, Shopify, Vault, Terraform
Cloud, ...), bearer / basic credentials, JWTs, private keys (PEM blocks, PuTTY, base64 PEM),
the formats of credential files (a registry's `auth`, `.netrc` entries, `.pgpass` lines: see
`selftaught.credential_files`), passwords (and tokens) in URLs, `name = value`
pairs whose name says secret (`password=`, `secret:`, `"api_key": "..."`,
`AWS_SECRET_ACCESS_KEY=`), the same said in prose ("my password is ...", "the aws secret
access key is ..."), and passwords on command lines (`mysql -p...`, `sshpass -p`, `curl -u`).
A value must look like its kind: a name such as `n_pass` or `secret` in prose needs a value
with more than plain words or numbers (`n_pass = 1024`, "the secret: practice daily" stay),
and an unquoted code reference (`password = self.password`) is left alone.
A secret becomes `[REDACTED:<name>]`; redacting twice changes nothing. Extra patterns come from
the caller (`redact_text(text, extra_patterns)`, `Redactor(...)`) or from
`<home>/redact_patterns.txt` (one regex per line; the whole match, or group 1 when there is
one, is redacted).

Keys selftaught was given (a model's or the proxy's API key: `add_secret`, and the vendors' key
variables: KEY_VARIABLES) are replaced wherever they stand, whatever they look like, before the
table runs: an upstream may quote the key it was sent in an error.

Deliberately left alone: bare high-entropy strings (git hashes, sha256, UUIDs, base64 data),
because they are what code is full of; a secret without a known prefix or a telling name is
missed. `tests/test_sleep_redact.py` measures both sides on a corpus.

In bounded time: every gap in a pattern is bounded, so each pattern costs time linear in the
text (`tests/test_redact_bounded.py` times each on inputs built from its own literals), and
one call (one logged row) has a deadline, `$SELFTAUGHT_REDACT_DEADLINE_S` or
DEFAULT_DEADLINE_S. It is checked between patterns and between windows of a long text; a text
not done in time becomes WITHHELD (the placeholder says how many characters), never the text.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from selftaught.errors import ConfigError, SelftaughtError
from selftaught.given_keys import MARK, scrub_secrets
from selftaught.runs import sleep_home

# What a text becomes when redacting it ran past its deadline: withheld, never stored as is.
WITHHELD = "[selftaught: redaction timed out; {} characters withheld]"
DEADLINE_ENV = "SELFTAUGHT_REDACT_DEADLINE_S"
DEFAULT_DEADLINE_S = 5.0  # per row (per call): every text of one logged exchange together
# A text longer than WINDOW + OVERLAP is searched WINDOW characters at a time (a match may run
# OVERLAP characters on), so the deadline is checked between windows, not only between
# patterns; a match that reaches a window's end is matched again on the whole text.
WINDOW = 1 << 18
OVERLAP = 1 << 14
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
    `check` (optional) must accept the secret, for patterns that need more than a regex;
    `gate` (optional): lower-case strings one of which every match holds, whatever its case,
    so a text without any is not searched."""

    name: str
    regex: re.Pattern[str]
    group: int | tuple[int, ...] = 0
    check: Any = None
    gate: tuple[str, ...] = ()


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


def _p(
    name: str,
    regex: str,
    group: int | tuple[int, ...] = 0,
    check: Any = None,
    gate: tuple[str, ...] = (),
) -> Pattern:
    return Pattern(name, re.compile(regex), group, check, gate)


_EDGE = r"(?<![A-Za-z0-9_\-])"  # start of a token
_END = r"(?![A-Za-z0-9_\-])"

# Every gap in the table is bounded, and no two neighbouring parts can take the same
# characters, so that no text makes a pattern scan one stretch again and again: an unbounded
# `[^\n]*?` gap made `"curl " * N` quadratic (100 KB: 34 s). `tests/test_redact_bounded.py`
# times each pattern on inputs built from its own literals.
_SP = r"\s{0,64}"  # whitespace where a value may be aligned

# A value said in prose: "is", "was", ":" or "=" after the name, maybe quoted.
_PROSE_IS = _SP + r"(?:\bis\b|\bwas\b|:|=)" + _SP + r"(?:[:=]" + _SP + r")?[`'\"]?"
_PROSE_VALUE = r"([^\s`'\"]{3,200})"

_MYSQL = r"mysql|mysqldump|mysqladmin|mariadb|mariadb-dump|mysqlimport|mysqlsh"
_LOGIN = r"sshpass|docker\s{1,64}login|podman\s{1,64}login|helm\s{1,64}registry\s{1,64}login"
_FLAG_VALUE = r"(?:'([^'\n]{1,1000})'|\"([^\"\n]{1,1000})\"|([^\s'\"]+))"


def _named(names: str, first: str) -> str:
    """`name = value`, `"name": "value"`, `name => value`. The name may end an identifier
    that starts within 40 characters (not after 41 letters or digits): the same as a
    non-alphanumeric character, then up to 40 identifier characters, then the name, without
    trying the names 40 times a start. `first` holds every name's first character: it and
    the lookahead keep the slower parts off most characters."""
    return (
        r"(?i)(?=[" + first + "])(?=(?:" + names + r"))(?<![A-Za-z0-9]{41})(?:" + names + r")['\"]?"
        + _SP + "(?:[:=]|=>|:=)" + _SP + _ALREADY + _VALUE
    )  # fmt: skip


def _command_gap(commands: str) -> str:
    """What a command's password flag may follow on its line: at most 1000 characters, and
    never past the next mention of the command, so each character is scanned from one start
    (`"mysql " * N` makes N starts)."""
    return r"(?:(?!\b(?:" + commands + r")\b)[^\n|;&]){0,1000}?"


def _prefixed(name: str, regex: str, gate: tuple[str, ...], check: Any = None) -> Pattern:
    """A vendor token: a distinctive prefix, at a token's edges."""
    return _p(name, _EDGE + regex + _END, 0, check, gate)


# .netrc: the space between words, a diff's `+` / `-` after a newline included; a word; and a
# `login` / `account` / `port` field
_NETRC_GAP = r"(?:[ \t]|\r?\n[+\-]?){1,64}"
_NETRC_WORD = r"\S{1,256}"
_NETRC_FIELD = "(?:" + _NETRC_GAP + "(?:login|account|port)" + _NETRC_GAP + _NETRC_WORD + ")"


def _b64(value: str) -> bytes | None:
    try:
        return base64.b64decode(value + "=" * (-len(value) % 4), validate=True)
    except (binascii.Error, ValueError):
        return None


def _basic_credentials(value: str) -> bool:
    """base64 of `user:password`, as a registry's `auth` holds."""
    raw = _b64(value)
    try:
        text = raw.decode("utf-8") if raw else ""
    except UnicodeDecodeError:
        return False
    _user, sep, password = text.partition(":")
    return bool(sep and password) and text.isprintable()


def _base64_private_key(value: str) -> bool:
    """base64 of a PEM block whose armour says PRIVATE KEY (not a certificate)."""
    head = value[:96]
    raw = _b64(head[: len(head) - len(head) % 4])
    return raw is not None and b"PRIVATE KEY" in raw


def _mixed_token(value: str) -> bool:
    """Random letters of both cases and digits (a Vault token body), not a word."""
    body = value[2:]
    return (
        any(c.isdigit() for c in body)
        and any(c.isupper() for c in body)
        and any(c.islower() for c in body)
    )


_AWS_SAID = (  # "aws_secret_access_key = ", "the AWS secret key is "
    r"(?i)(?:aws|amazon)[\w\-. ]{0,30}?(?:secret|private)[\w\-. ]{0,20}?"
    r"(?:['\"]?" + _SP + "[:=]" + _SP + r"['\"]?"
    r"|\s{1,64}(?:is|was)" + _SP + ":?" + _SP + r"['\"`]?)"
)  # fmt: skip


BUILTIN_PATTERNS: tuple[Pattern, ...] = (
    _p(
        "private_key",
        r"-----BEGIN (?:[A-Z0-9]{1,20} ){0,4}PRIVATE KEY(?: BLOCK)?-----[\s\S]*?"
        r"(?:-----END (?:[A-Z0-9]{1,20} ){0,4}PRIVATE KEY(?: BLOCK)?-----|\Z)",
        gate=("private key",),
    ),
    # PuTTY's .ppk: the lines after `Private-Lines: N`
    _p(
        "private_key",
        r"(?i)Private-Lines:[ \t]{0,64}\d{1,4}[ \t]{0,64}\r?\n([A-Za-z0-9+/=\r\n]{16,20000})",
        1,
        gate=("private-lines",),
    ),
    # a PEM private key in base64 (kubeconfig's client-key-data, a Kubernetes secret's
    # tls.key): "LS0tLS1CRUdJTi" is "-----BEGIN "; a certificate's is left alone
    _p(
        "private_key",
        r"LS0tLS1CRUdJTi[A-Za-z0-9+/]{16,20000}={0,2}",
        0,
        _base64_private_key,
        ("ls0tls1crudjti",),
    ),
    # an OpenSSH key's body without its armour ("b3BlbnNzaC1rZXktdjE" is "openssh-key-v1")
    _p(
        "private_key",
        r"b3BlbnNzaC1rZXktdjE[A-Za-z0-9+/=\r\n]{40,20000}",
        gate=("b3blbnnzac1rzxktdje",),
    ),
    _prefixed("anthropic_key", r"sk-ant-[A-Za-z0-9_\-]{20,}", ("sk-ant-",)),
    # sk-, sk-proj-, sk-svcacct-, sk-admin-, sk-or-v1- (OpenRouter), DeepSeek's sk-<hex>
    _prefixed("openai_key", r"sk-[A-Za-z0-9_\-]{20,}", ("sk-",), _has_key_segment),
    # the console's CSV and pasted pairs: the key id, then its secret (before
    # the id is redacted)
    _p(
        "aws_secret_key",
        r"\b(?:AKIA|ASIA)[0-9A-Z]{16}['\"]?[\s,;:|]{1,20}['\"]?([A-Za-z0-9/+]{40})(?![A-Za-z0-9/+])",
        1,
        gate=("akia", "asia"),
    ),
    _p(
        "aws_access_key_id",
        r"\b(?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AROA)[0-9A-Z]{16}\b",
        gate=("akia", "asia", "abia", "acca", "agpa", "aida", "aroa"),
    ),
    _p(
        "aws_secret_key",
        _AWS_SAID + r"([A-Za-z0-9/+]{40})(?![A-Za-z0-9/+])",
        1,
        gate=("aws", "amazon"),
    ),
    _p(
        "github_token",
        r"\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{30,}\b",
        gate=("ghp_", "gho_", "ghu_", "ghs_", "ghr_"),
    ),
    _p("github_token", r"\bgithub_pat_[A-Za-z0-9_]{22,}\b", gate=("github_pat_",)),
    _prefixed(
        "gitlab_token",
        r"gl(?:pat|dt|rt|ptt|cbt|oas|soat|ft|imt|agent)-[A-Za-z0-9_\-]{20,}",
        ("glpat-", "gldt-", "glrt-", "glptt-", "glcbt-", "gloas-", "glsoat-", "glft-", "glimt-")
        + ("glagent-",),
    ),
    _p("slack_token", r"\bxox[abposre]-[A-Za-z0-9\-]{10,}", 0, _has_digit, ("xox",)),
    _prefixed("slack_token", r"xapp-\d-[A-Za-z0-9\-]{20,}", ("xapp-",)),
    _p(
        "slack_webhook",
        r"https://hooks\.slack\.com/(?:services|workflows)/[A-Za-z0-9_/\-]{20,}",
        gate=("hooks.slack.com/",),
    ),
    _p("google_api_key", r"\bAIza[0-9A-Za-z_\-]{35}" + _END, gate=("aiza",)),
    _p("google_oauth_token", r"\bya29\.[0-9A-Za-z_\-]{20,}", gate=("ya29.",)),
    _p(
        "stripe_key",
        r"\b(?:sk|rk|pk|whsec)_(?:live|test)_[0-9A-Za-z]{16,}\b",
        gate=("_live_", "_test_"),
    ),
    _p("stripe_key", r"\bwhsec_[0-9A-Za-z]{24,}\b", gate=("whsec_",)),
    _p("huggingface_token", r"\bhf_[A-Za-z0-9]{30,}\b", gate=("hf_",)),
    _p("npm_token", r"\bnpm_[A-Za-z0-9]{36}\b", gate=("npm_",)),
    _prefixed("pypi_token", r"pypi-AgE[A-Za-z0-9_\-]{50,}", ("pypi-age",)),
    _prefixed("groq_key", r"gsk_[A-Za-z0-9]{20,}", ("gsk_",)),
    _prefixed("xai_key", r"xai-[A-Za-z0-9]{20,}", ("xai-",)),
    _prefixed("docker_token", r"dckr_(?:pat|oat)_[A-Za-z0-9_\-]{20,}", ("dckr_",)),
    _prefixed("sendgrid_key", r"SG\.[A-Za-z0-9_\-]{16,}\.[A-Za-z0-9_\-]{16,}", ("sg.",)),
    _p(  # also inside a bot API URL: /bot<token>/sendMessage
        "telegram_bot_token",
        r"(?:(?<=/bot)|(?<![A-Za-z0-9]))\d{6,12}:AA[A-Za-z0-9_\-]{30,}" + _END,
        gate=(":aa",),
    ),
    _prefixed("digitalocean_token", r"do[opr]_v1_[a-f0-9]{64}", ("doo_v1_", "dop_v1_", "dor_v1_")),
    _prefixed(
        "shopify_token",
        r"shp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}",
        ("shpat_", "shpca_", "shppa_", "shpss_"),
    ),
    # HashiCorp Vault: hvs. / hvb. / hvr. tokens, and the older s. / b. / r. + 24 characters
    _prefixed("vault_token", r"hv[sbr]\.[A-Za-z0-9_\-]{24,}", ("hvs.", "hvb.", "hvr.")),
    _p(
        "vault_token",
        r"(?<![\w.\-/])[sbr]\.[A-Za-z0-9]{24}(?![\w.\-])",
        0,
        _mixed_token,
        ("s.", "b.", "r."),
    ),
    _prefixed(  # Terraform Cloud / Enterprise (credentials.tfrc.json)
        "terraform_token",
        r"[A-Za-z0-9]{14}\.atlasv1\.[A-Za-z0-9_\-=]{60,}",
        ("atlasv1",),
    ),
    _prefixed(
        "vendor_token",
        r"(?:lin_api_[A-Za-z0-9]{30,}|r8_[A-Za-z0-9]{30,}|pplx-[A-Za-z0-9]{40,}|"
        r"ntn_[A-Za-z0-9]{30,}|dapi[a-f0-9]{32}|key-[a-f0-9]{32}|NRAK-[A-Z0-9]{27}|"
        r"ATATT3[A-Za-z0-9_\-=]{50,}|glsa_[A-Za-z0-9_]{32,}|sntrys_[A-Za-z0-9_=+/]{40,}|"
        r"GOCSPX-[A-Za-z0-9_\-]{28})",
        ("lin_api_", "r8_", "pplx-", "ntn_", "dapi", "key-", "nrak-", "atatt3", "glsa_", "sntrys_")
        + ("gocspx-",),
    ),
    _p(
        "jwt",
        # a header stops before the next `-eyJ` (where another match may start) and at
        # 4000 characters, so no start scans another's header again
        r"\beyJ(?:(?!-eyJ)[A-Za-z0-9_\-]){8,4000}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",
        gate=("eyj",),
    ),
    _p(
        "bearer_token",
        r"(?i)\b(?:bearer|token)\s{1,64}" + _ALREADY + r"([A-Za-z0-9\-._~+/]{16,}=*)",
        1,
        _looks_random,
        ("bearer", "token"),
    ),
    _p(
        "basic_auth",
        r"(?i)\bauthorization"
        + _SP
        + "[:=]"
        + _SP
        + r"['\"]?basic\s{1,64}"
        + _ALREADY
        + r"([A-Za-z0-9+/]{8,}=*)",
        1,
        gate=("authorization",),
    ),  # fmt: skip
    # scheme://user:password@ and scheme://:password@. The password runs to the last `@`
    # (within 200 characters): it may hold `/`, `?`, `#` or `@`; a port followed by a path
    # (host:8080/path?mail=a@b) is no password.
    _p(
        "url_password",
        r"\b[A-Za-z][A-Za-z0-9+.\-]{1,20}://[^\s:/@\"'<>\[\]]{0,100}:"
        + _ALREADY
        + r"(?!\d{1,5}[/?#])([^\s\"'<>]{1,200})@",
        1,
        gate=("://",),
    ),
    # scheme://TOKEN@host (a Sentry DSN, a token used as the user name)
    _p(
        "url_token",
        r"\b[A-Za-z][A-Za-z0-9+.\-]{1,20}://" + _ALREADY + r"([A-Za-z0-9_\-]{16,200})@",
        1,
        _looks_random,
        ("://",),
    ),
    _p("password", _named(_STRONG_PASSWORD_NAMES, "p"), (1, 2, 3), _is_password, ("pass",)),
    _p(
        "password",
        _named(_WEAK_PASSWORD_NAMES, "sc_-"),
        (1, 2, 3),
        _is_weak_named_password,
        ("secret", "pass", "pwd"),
    ),
    # prose: "my password is hunter2x!", "the pwd for staging was ..."
    _p(
        "password",
        # "for the staging db": a gap that begins and ends with a non-space, so the spaces
        # around it belong to one part only
        r"(?i)\b(?:pass(?:word|wd|phrase|code)|pwd|pw)\b"
        r"(?:\s{1,64}(?:for|of|to|on)\s{1,64}[^\s:=](?:[^\n:=]{0,38}?[^\s:=])??)?"
        + _PROSE_IS
        + _ALREADY
        + _PROSE_VALUE,
        1,
        _looks_like_password,
        ("pass", "pw"),
    ),
    # .netrc / _netrc: `machine HOST` (or `default`) then `login`, `account`, `port` in any
    # order, then `password PASS`, on one line or several (a diff's `+` / `-` included)
    _p(
        "password",
        r"(?i)\b(?:machine"
        + _NETRC_GAP
        + _NETRC_WORD
        + _NETRC_FIELD
        + "{0,3}|default"
        + _NETRC_FIELD
        + "{1,3})"
        + _NETRC_GAP
        + "password"
        + _NETRC_GAP
        + _ALREADY
        + r"(\S{1,1000})",
        1,
        _is_password,
        ("machine", "default"),
    ),  # fmt: skip
    # .pgpass: HOST:PORT:DATABASE:USER:PASSWORD, a line of its own (a diff's prefix allowed)
    _p(
        "password",
        r"(?m)^[+\- ]?(?![+\-])[^\s:#][^\s:]{0,254}:(?:\d{1,5}|\*):[^\s:]{1,255}:[^\s:]{1,255}:"
        + _ALREADY
        + r"(\S{1,1000})",
        1,
        _is_password,
        (":",),
    ),  # fmt: skip
    # registries: docker's and podman's `"auth": base64(user:password)`, npm's `_auth=`, and
    # a Kubernetes secret's `.dockerconfigjson` (a whole config.json, base64)
    _p(
        "registry_auth",
        r"(?i)(?<![\w.\-])[\"']?_?auth[\"']?"
        + _SP
        + "[:=]"
        + _SP
        + r"[\"']?"
        + _ALREADY
        + r"([A-Za-z0-9+/]{8,4000}={0,2})(?![A-Za-z0-9+/=])",
        1,
        _basic_credentials,
        ("auth",),
    ),  # fmt: skip
    _p(
        "registry_auth",
        r"(?i)\.docker(?:configjson|cfg)[\"']?"
        + _SP
        + ":"
        + _SP
        + r"[\"']?"
        + _ALREADY
        + r"([A-Za-z0-9+/]{16,20000}={0,2})",
        1,
        gate=(".docker",),
    ),  # fmt: skip
    _p(
        "secret_value",
        _named(_KEY_NAMES, "aspritcewb"),
        (1, 2, 3),
        _looks_random,
        ("key", "token", "credential", "secret"),
    ),
    # prose: "the api key is ...", "my storage account key: ..."
    _p(
        "secret_value",
        r"(?i)\b(?:api|access|secret|account|storage|private|signing|encryption|master|license)"
        r"[ _-]?(?:access[ _-]?)?key\b" + _PROSE_IS + _ALREADY + _PROSE_VALUE,
        1,
        _looks_random,
        ("key",),
    ),
    _p(
        "secret_value",
        r"(?i)\b(?:(?:api|auth|access|bearer|refresh|bot|session|personal[ _-]access)[ _-]?)?"
        r"token\b" + _PROSE_IS + _ALREADY + _PROSE_VALUE,
        1,
        _looks_random,
        ("token",),
    ),
    _p(
        "cli_secret_flag",
        r"(?i)--(?:password|passwd|api-key|token|secret|access-key|client-secret|auth-token)"
        r"(?:\s{1,64}|=)"
        + _ALREADY
        + r"(?:'([^'\n]{3,1000})'|\"([^\"\n]{3,1000})\"|([^\s\"']{3,}))",
        (1, 2, 3),
        gate=("--",),
    ),  # fmt: skip
    # mysql -pSECRET (no space: with one, -p prompts and the word is the database)
    _p(
        "cli_password",
        r"\b(?:" + _MYSQL + r")\b" + _command_gap(_MYSQL) + r"\s-p" + _ALREADY + _FLAG_VALUE,
        (1, 2, 3),
        gate=("mysql", "mariadb"),
    ),
    # sshpass -p SECRET, docker login -p SECRET, curl -u user:SECRET
    _p(
        "cli_password",
        r"\b(?:" + _LOGIN + r")\b" + _command_gap(_LOGIN) + r"\s-p" + _SP + _ALREADY + _FLAG_VALUE,
        (1, 2, 3),
        _is_password,
        ("sshpass", "login"),
    ),
    _p(
        "cli_password",
        r"\bcurl\b"
        + _command_gap("curl")
        + r"\s(?:-u|--user)"
        + _SP
        + r"['\"]?[^\s:'\"]{1,256}:"
        + _ALREADY
        + r"([^\s'\"]+)",
        1,
        _is_password,
        ("curl",),
    ),  # fmt: skip
)


def default_deadline_s() -> float:
    """The redaction deadline in seconds: `$SELFTAUGHT_REDACT_DEADLINE_S`, else
    DEFAULT_DEADLINE_S."""
    raw = os.environ.get(DEADLINE_ENV, "").strip()
    if not raw:
        return DEFAULT_DEADLINE_S
    try:
        seconds = float(raw)
    except ValueError:
        seconds = 0.0
    if not seconds > 0 or seconds == float("inf"):
        raise ConfigError(f"{DEADLINE_ENV}={raw!r}: expected a number of seconds above 0")
    return seconds


class _TimedOut(SelftaughtError):
    """A deadline passed in the middle of a text; caught in `Redactor.redact`, never raised
    out of this module."""


@dataclass
class RedactionDeadline:
    """One budget of redaction time, shared by the texts of one row. `withheld` counts the
    texts that were replaced by the WITHHELD placeholder because it ran out."""

    seconds: float
    withheld: int = 0
    expires: float = field(init=False)

    def __post_init__(self) -> None:
        self.expires = time.monotonic() + self.seconds

    def check(self) -> None:
        if time.monotonic() > self.expires:
            raise _TimedOut


def load_extra_patterns(path: str | Path | None = None) -> list[str]:
    """Regexes from `<home>/redact_patterns.txt` (or `path`): one per line, `#` comments."""
    file = Path(path) if path else sleep_home() / "redact_patterns.txt"
    if not file.is_file():
        return []
    lines = file.read_text(encoding="utf-8").splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]


@dataclass
class Redactor:
    """Applies the built-in table plus `extra_patterns` (regex strings; group 1 when present),
    within `deadline_s` seconds per call (default: `default_deadline_s()`); a text not done
    in time is withheld whole. `withheld` counts such texts over the redactor's life."""

    extra_patterns: Sequence[str] = ()
    deadline_s: float | None = None
    window: int = WINDOW
    overlap: int = OVERLAP
    patterns: list[Pattern] = field(init=False)
    withheld: int = field(init=False, default=0, compare=False)
    _lock: threading.Lock = field(
        init=False, repr=False, compare=False, default_factory=threading.Lock
    )

    def __post_init__(self) -> None:
        if self.deadline_s is None:
            self.deadline_s = default_deadline_s()
        elif not self.deadline_s > 0:
            raise ConfigError(f"redaction deadline {self.deadline_s!r}: expected seconds above 0")
        if self.window < 1 or self.overlap < 0:
            raise ConfigError("redaction window must be at least 1 and its overlap at least 0")
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

    def deadline(self) -> RedactionDeadline:
        """A fresh budget of `deadline_s` seconds, to share between the texts of one row."""
        assert self.deadline_s is not None
        return RedactionDeadline(self.deadline_s)

    def redact(self, text: str, deadline: RedactionDeadline | None = None) -> tuple[str, int]:
        """`text` with every secret replaced, and how many were. Past the deadline (`deadline`,
        or a fresh one for this call) the whole text is WITHHELD instead, counted as one
        redaction (whatever was found before) and in `deadline.withheld`: fails closed."""
        deadline = deadline or self.deadline()
        out, total = scrub_secrets(text)
        try:
            deadline.check()  # a row's spent deadline: not even the folding below
            folded = _fold(out)
            for pattern in self.patterns:
                deadline.check()
                if pattern.gate and not any(word in folded for word in pattern.gate):
                    continue
                out, n = _apply(pattern, out, deadline, self.window, self.overlap, folded)
                if n:
                    total += n
                    folded = _fold(out)
        except _TimedOut:
            deadline.withheld += 1
            with self._lock:
                self.withheld += 1
            return WITHHELD.format(len(text)), 1
        return out, total

    def redact_value(
        self, value: Any, deadline: RedactionDeadline | None = None
    ) -> tuple[Any, int]:
        """Redact every string inside a JSON-like value (dicts, lists); keys are kept. One
        deadline (`deadline`, or a fresh one) covers the whole value."""
        deadline = deadline or self.deadline()
        if isinstance(value, str):
            return self.redact(value, deadline)
        if isinstance(value, list):
            out, total = [], 0
            for item in value:
                red, n = self.redact_value(item, deadline)
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
                red, n = self.redact_value(item, deadline)
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


# The characters outside ASCII that a case-blind regex takes for an ASCII letter, and that
# `str.lower()` does not turn into it (tests/test_redact_bounded.py enumerates them).
_FOLD_TO_ASCII = {"\u0130": "i", "\u0131": "i", "\u017f": "s"}


def _fold(text: str) -> str:
    """`text` in lower case, for the gates: a gate word is in it wherever a case-blind
    pattern could match that word."""
    if not text.isascii():
        for char, letter in _FOLD_TO_ASCII.items():
            if char in text:  # rare: `str.translate` would cost more than the patterns
                text = text.replace(char, letter)
    return text.lower()


def _replacement(pattern: Pattern, m: re.Match[str]) -> str | None:
    """The match with its secret marked, or None when it holds none (no group, a marker, or
    a value the pattern's check refuses)."""
    groups = pattern.group if isinstance(pattern.group, tuple) else (pattern.group,)
    for g in groups:
        secret = m.group(g)
        if secret is None:
            continue
        if secret.startswith("[REDACTED") or (pattern.check and not pattern.check(secret)):
            return None
        start, end = m.start(g) - m.start(0), m.end(g) - m.start(0)
        whole = m.group(0)
        return whole[:start] + MARK.format(pattern.name) + whole[end:]
    return None


def _matches(
    pattern: Pattern,
    text: str,
    deadline: RedactionDeadline | None,
    window: int,
    overlap: int,
    folded: str = "",
) -> Iterator[re.Match[str]]:
    """`regex.finditer(text)`, a window at a time on a long text, checking the deadline
    between windows. A window sees `overlap` characters past its end, so a match that starts
    in it and is at most that long is found whole; one that reaches the window's edge may
    run on (a long token, a key block to its end) and is matched again on the whole text.
    A window without a gate word in `folded` (`_fold(text)`) is skipped: every gate word
    stands in a match's first few hundred characters."""
    regex, n = pattern.regex, len(text)
    if n <= window + overlap:
        yield from regex.finditer(text)
        return
    pos = 0
    while pos < n:
        if deadline is not None:
            deadline.check()
        stop, end = pos + window, min(pos + window + overlap, n)
        following = stop
        if folded and pattern.gate and all(folded.find(w, pos, end) < 0 for w in pattern.gate):
            pos = following
            continue
        for m in regex.finditer(text, pos, end):
            if m.start() >= stop and end < n:
                break  # the next window's
            if m.end() == end and end < n:
                whole = regex.match(text, m.start())
                if whole is None:  # only the window's edge made it match
                    following = m.start() + 1
                    break
                yield whole
                following = max(whole.end(), whole.start() + 1)
                break
            yield m
            following = max(stop, m.end())
        pos = following


def _apply(
    pattern: Pattern,
    text: str,
    deadline: RedactionDeadline | None = None,
    window: int = WINDOW,
    overlap: int = OVERLAP,
    folded: str = "",
) -> tuple[str, int]:
    count, last, out = 0, 0, []
    for m in _matches(pattern, text, deadline, window, overlap, folded):
        replaced = _replacement(pattern, m)
        if replaced is None:
            continue
        out += [text[last : m.start()], replaced]
        last = m.end()
        count += 1
    if not count:
        return text, 0
    out.append(text[last:])
    return "".join(out), count


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
    """Text as it may leave the log: logged text before it goes to an optimizer or judge model,
    and error text before it is printed or stored (an upstream may quote a key in it)."""
    return default_redactor().redact(text)[0]
