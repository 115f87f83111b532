"""The credential files selftaught never records nor rebuilds: one list, by tool, kept here.

A coding agent's session is recorded with the uncommitted changes of its repository
(`sleep/intake/repo_state.py`), and a night rebuilds a commit's files from it. A file matching
`CREDENTIAL_FILES` (by name, any folder, any case) or holding a private key
(`holds_private_key`, by content, whatever its name) is left out of both and named in the
record's `left_out`. What is recorded is redacted as well (`selftaught.redact`, which knows
these files' formats: a docker `auth`, a Vault token, a kubeconfig key, a netrc or pgpass
line...), so a credential under a name this list lacks is still masked where its format is
known.

A pattern is a glob on a path's last components: `.npmrc` is a file of that name anywhere,
`.docker/config.json` a `config.json` in a `.docker` folder anywhere. To add a tool, add its
row; `tests/test_security_files.py` holds a credential file per row.
"""

from __future__ import annotations

import fnmatch
from pathlib import PurePosixPath

from selftaught.redact import BUILTIN_PATTERNS, Pattern

CREDENTIAL_FILES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("environment files", (".env", ".env.*", "*.env", ".envrc")),
    ("ssh keys (and any private key, by content)",
     ("id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*", "*.ppk")),
    ("keys and key stores",
     ("*.pem", "*.key", "*.p8", "*.p12", "*.pfx", "*.jks", "*.keystore", "*.kdbx")),
    ("AWS", (".aws/credentials", ".aws/config", ".boto", ".s3cfg")),
    ("Google Cloud", ("gcloud/application_default_credentials.json", "gcloud/credentials.db",
                      "gcloud/access_tokens.db", "gcloud/legacy_credentials/*/*",
                      "client_secret*.json")),
    ("Azure", (".azure/accessTokens.json", ".azure/msal_token_cache.*",
               ".azure/service_principal_entries.json")),
    ("container registries", (".docker/config.json", ".dockercfg", "containers/auth.json")),
    ("HashiCorp Vault", (".vault-token",)),
    ("Kubernetes", (".kube/config", "kubeconfig", "kubeconfig.*", "*.kubeconfig")),
    ("Terraform", ("*.tfvars", "*.tfvars.json", "*.tfstate", "*.tfstate.backup",
                   "credentials.tfrc.json", ".terraformrc", "terraform.rc")),
    ("netrc and git", (".netrc", "_netrc", ".git-credentials")),
    ("databases", (".pgpass", ".my.cnf", ".mylogin.cnf")),
    ("package registries", (".npmrc", ".yarnrc.yml", ".pypirc", ".gem/credentials",
                            ".cargo/credentials", ".cargo/credentials.toml",
                            ".composer/auth.json", ".m2/settings-security.xml")),
    ("GitHub CLI", ("gh/hosts.yml",)),
    ("other", (".htpasswd", "credentials.json", "secrets.*")),
)  # fmt: skip
"""(tool, the globs of its credential files): names never recorded nor rebuilt."""

PATTERNS: tuple[str, ...] = tuple(p for _, globs in CREDENTIAL_FILES for p in globs)
_SPLIT = tuple(tuple(p.lower().split("/")) for p in PATTERNS)
_KEYS: tuple[Pattern, ...] = tuple(p for p in BUILTIN_PATTERNS if p.name == "private_key")


def credential_file(path: str) -> bool:
    """Whether `path` (relative, '/'-separated) names a credential file of the list."""
    parts = tuple(p.lower() for p in PurePosixPath(path).parts)
    return any(_ends_with(parts, globs) for globs in _SPLIT)


def _ends_with(parts: tuple[str, ...], globs: tuple[str, ...]) -> bool:
    if len(parts) < len(globs):
        return False
    tail = parts[len(parts) - len(globs) :]
    return all(fnmatch.fnmatchcase(p, g) for p, g in zip(tail, globs, strict=True))


def holds_private_key(data: bytes) -> bool:
    """Whether `data` holds a private key, whatever the file's name: a PEM block (`-----BEGIN
    ... PRIVATE KEY-----`, an OpenSSH key, a PGP private key block), a PuTTY key, an OpenSSH
    key's body or a base64 PEM key (kubeconfig's client-key-data): the redactor's own
    `private_key` patterns, so that both agree on what a key is."""
    if b"openssh-key-v1\0" in data:  # the binary form
        return True
    text = data.decode("utf-8", "replace")
    for pattern in _KEYS:
        for m in pattern.regex.finditer(text):
            groups = pattern.group if isinstance(pattern.group, tuple) else (pattern.group,)
            value = next((m.group(g) for g in groups if m.group(g) is not None), "")
            if pattern.check is None or pattern.check(value):
                return True
    return False
