"""Security round five: files (issue 63, classes 4-6).

- **Session snapshots store no credentials.** A table of credential files, one or more per
  tool (cloud CLIs, container registries, vault, kubeconfig, terraform, netrc, pgpass,
  git-credentials, package registries, `.env`, gh, ssh keys of any name): under their own
  names they are left out of the SessionStart snapshot (`left_out`); their contents under an
  innocent name are stored only as the redactor leaves them, and no secret survives it.
- **A rebuild writes only inside its folder.** A hostile commit (a symlink to a folder outside
  plus a file under it, colliding paths) is refused and writes nothing outside.
- **Write-back never goes through a symlink.** With `REPO/.claude` (or the SKILL.md itself)
  replaced by a symlink to a same-bytes copy outside the repository, adopt and rollback refuse
  and the outside file is untouched; on both log backends."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from selftaught.redact import Redactor
from selftaught.runs import Inside, PathRefused, path_parts
from selftaught.sleep.adoption import staging
from selftaught.sleep.adoption.placement import read_document
from selftaught.sleep.adoption.write_back import WriteBackError, source_of, write_back
from selftaught.sleep.intake.repo_state import (
    RepoState,
    RepoStateError,
    capture,
    materialise,
    record_end,
    record_start,
)
from selftaught.sleep.night.cycle import NightConfig, night_training_defaults, run_night
from selftaught.sleep.paths import Unit
from tests.test_agent_workspace import git, repo
from tests.test_sleep_skills import PROJECT, fill_two_intents, two_rule_models
from tests.test_sleep_start_files import cli_run, user_skill

# ---- class 4: credential files --------------------------------------------------------------


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


PEM_BODY = "\n".join(
    base64.b64encode(hashlib.sha512(bytes([i])).digest()).decode()[:64] for i in range(8)
)
RSA_KEY = f"-----BEGIN RSA PRIVATE KEY-----\n{PEM_BODY}\n-----END RSA PRIVATE KEY-----\n"
OPENSSH_KEY = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAAB\n"
    f"{PEM_BODY}\n-----END OPENSSH PRIVATE KEY-----\n"
)
PUTTY_KEY = (
    "PuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none\nComment: deploy\nPublic-Lines: 2\n"
    "AAAAC3NzaC1lZDI1NTE5AAAAIOZkPuttyPublicPartAAAAAAAAAAAAAAAAAAAAA\nAAAAAAAA\n"
    "Private-Lines: 1\nAAAAIHpUttyPr1vateKeyB0dyQ9x7Zk3mLp2Wq8Rt5Yv1Nc4\n"
    "Private-MAC: 5d0b3f0c2f1e4a6b8c9d0e1f2a3b4c5d6e7f8a9b0c1d2e3f4a5b6c7d8e9f0a1b\n"
)
KUBE_KEY_DATA = b64(RSA_KEY)
DOCKER_AUTH = b64("jane:Dock3rHubPassw0rd")
VAULT_TOKEN = "hvs.CAESIJlU9JMYEhOPYv4Uhb7A0YZ3mPtWzExampleT0ken1234GiQKHGh2cy5"
VAULT_LEGACY = "s.Xa9bC3dE5fG7hJ2kL4mN6pQ8"
AWS_ID, AWS_SECRET = "AKIAQ3EGUQ5EXAMPL7ZX", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLE12"
TF_TOKEN = "AbCdEfGh123456.atlasv1." + "ZyXwVuTsRqPoNmLkJiHgFeDcBa0987654321" * 2


@dataclass(frozen=True)
class CredentialFile:
    """A credential file as its tool writes it: where (relative to a home or a repository),
    its text, the secrets in it, and whether the redactor can see them (False: a binary or
    a hash, left out by name only)."""

    path: str
    text: str
    secrets: tuple[str, ...]
    readable: bool = True


CREDENTIAL_FILES = (
    CredentialFile(".aws/credentials",
                   f"[default]\naws_access_key_id = {AWS_ID}\naws_secret_access_key = "
                   f"{AWS_SECRET}\naws_session_token = IQoJb3JpZ2luX2VjEHwaCXVzLWVhc3Qt7x9Kq2\n",
                   (AWS_ID, AWS_SECRET, "IQoJb3JpZ2luX2VjEHwaCXVzLWVhc3Qt7x9Kq2")),
    CredentialFile(".aws/config", f"[profile ci]\nregion = eu-west-1\naws_secret_access_key="
                   f"{AWS_SECRET}\n", (AWS_SECRET,)),
    CredentialFile(".config/gcloud/application_default_credentials.json", json.dumps({
        "client_id": "7640-abc.apps.googleusercontent.com", "client_secret": "d-FL95Q19q7MQmFpd7h",
        "refresh_token": "1//0gAbCdEfGhIjKlMnOpQrStUvWxYz0123456789-abcdefgHIJK",
        "type": "authorized_user"}, indent=2),
        ("d-FL95Q19q7MQmFpd7h", "1//0gAbCdEfGhIjKlMnOpQrStUvWxYz0123456789-abcdefgHIJK")),
    CredentialFile(".config/gcloud/credentials.db",
                   "SQLite format 3\0\x10\x00refresh_token\x001//0gSqliteR3freshT0ken\0\x07",
                   ("1//0gSqliteR3freshT0ken",), readable=False),
    CredentialFile(".azure/msal_token_cache.json", json.dumps({"RefreshToken": {"k": {
        "credential_type": "RefreshToken", "secret": "0.AXoAbCdEfGh1234567890IjKlMnOpQrSt"}}}),
        ("0.AXoAbCdEfGh1234567890IjKlMnOpQrSt",)),
    CredentialFile(".azure/accessTokens.json", json.dumps([{
        "refreshToken": "0.ARwAzUre1234567890RefreshAbCdEfGh", "tokenType": "Bearer"}]),
        ("0.ARwAzUre1234567890RefreshAbCdEfGh",)),
    CredentialFile(".docker/config.json", json.dumps(
        {"auths": {"https://index.docker.io/v1/": {"auth": DOCKER_AUTH}}}, indent="\t"),
        (DOCKER_AUTH,)),
    CredentialFile(".dockercfg", json.dumps({"registry.example.com": {
        "auth": b64("old:Dockercfg-Passw0rd"), "email": "a@example.com"}}),
        (b64("old:Dockercfg-Passw0rd"),)),
    CredentialFile(".config/containers/auth.json", json.dumps(
        {"auths": {"quay.io": {"auth": b64("bot+ci:Qu4yRobotT0kenValue")}}}),
        (b64("bot+ci:Qu4yRobotT0kenValue"),)),
    CredentialFile(".vault-token", VAULT_TOKEN, (VAULT_TOKEN,)),
    CredentialFile("ops/.vault-token", VAULT_LEGACY + "\n", (VAULT_LEGACY,)),
    CredentialFile(".kube/config",
                   "apiVersion: v1\nusers:\n- name: admin\n  user:\n"
                   f"    client-certificate-data: {b64('-----BEGIN CERTIFICATE-----')}\n"
                   f"    client-key-data: {KUBE_KEY_DATA}\n"
                   "    token: 8f2a1c7e9b3d4f6a0e5c2b1d7a9f3e4c\n",
                   (KUBE_KEY_DATA[20:80], "8f2a1c7e9b3d4f6a0e5c2b1d7a9f3e4c")),
    CredentialFile("deploy/kubeconfig", "users:\n- name: ci\n  user:\n    username: ci\n"
                   "    password: Kub3CfgPassw0rd\n", ("Kub3CfgPassw0rd",)),
    CredentialFile("infra/prod.tfvars", 'db_password = "Tf-Var-Passw0rd!"\n'
                   'api_token   = "tfv4rT0kenAbCdEf123456"\n',
                   ("Tf-Var-Passw0rd!", "tfv4rT0kenAbCdEf123456")),
    CredentialFile("infra/terraform.tfstate", json.dumps({"resources": [{"instances": [
        {"attributes": {"password": "St4teFilePassw0rd", "private_key_pem": RSA_KEY}}]}]}),
        ("St4teFilePassw0rd", PEM_BODY[:40])),
    CredentialFile(".terraform.d/credentials.tfrc.json",
                   json.dumps({"credentials": {"app.terraform.io": {"token": TF_TOKEN}}}),
                   (TF_TOKEN,)),
    CredentialFile(".netrc", "machine api.example.com\n  login jane\n  password N3trcPassw0rd\n"
                   "machine b.example.com password Other-N3trc-9 login joe\n",
                   ("N3trcPassw0rd", "Other-N3trc-9")),
    CredentialFile("_netrc", "default login anonymous password Anon-Passw0rd9\n",
                   ("Anon-Passw0rd9",)),
    CredentialFile(".pgpass", "db.internal:5432:app:jane:PgPassw0rd!x\n*:*:*:ops:0psEverywhere\n",
                   ("PgPassw0rd!x", "0psEverywhere")),
    CredentialFile(".git-credentials", "https://jane:G1tCredPassw0rd@git.example.com\n",
                   ("G1tCredPassw0rd",)),
    CredentialFile(".npmrc", f"//registry.example.com/:_auth={b64('jane:Npm-Passw0rd1')}\n"
                   "//registry.npmjs.org/:_authToken=npm_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789\n",
                   (b64("jane:Npm-Passw0rd1"), "npm_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789")),
    CredentialFile(".pypirc", "[pypi]\nusername = __token__\npassword = pypi-AgEIcHlwaS5vcmc"
                   "AbCdEfGhIjKlMnOpQrStUvWxYz0123456789AbCdEfGhIjKlMnOp\n",
                   ("pypi-AgEIcHlwaS5vcmcAbCdEfGhIjKlMnOpQrStUvWxYz0123456789",)),
    CredentialFile(".env.production", "DATABASE_PASSWORD=EnvF1lePassw0rd\n",
                   ("EnvF1lePassw0rd",)),
    CredentialFile(".config/gh/hosts.yml", "github.com:\n    oauth_token: "
                   "gho_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789\n    user: jane\n",
                   ("gho_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",)),
    CredentialFile(".my.cnf", "[client]\nuser=jane\npassword=MyCnfPassw0rd\n", ("MyCnfPassw0rd",)),
    CredentialFile(".s3cfg", f"[default]\naccess_key = {AWS_ID}\nsecret_key = {AWS_SECRET}\n",
                   (AWS_ID, AWS_SECRET)),
    CredentialFile(".cargo/credentials.toml", '[registry]\ntoken = "cio1234567890abcdefABCDEF12"\n',
                   ("cio1234567890abcdefABCDEF12",)),
    CredentialFile(".htpasswd", "jane:$apr1$r31.9aZq$HqJZimcKQFAMYayBlzkrA/\n",
                   ("HqJZimcKQFAMYayBlzkrA",), readable=False),
    # ssh and other private keys, under names no list holds: known by their content
    CredentialFile("deploy/ci", OPENSSH_KEY, (PEM_BODY[:40],)),
    CredentialFile("keys/server", RSA_KEY.replace("RSA", "EC"), (PEM_BODY[:40],)),
    CredentialFile("keys/login", PUTTY_KEY, ("AAAAIHpUttyPr1vateKeyB0dyQ9x7Zk3mLp2Wq8Rt5Yv1Nc4",)),
    CredentialFile("ci/gcp-runner.json", json.dumps({"type": "service_account",
                   "private_key": RSA_KEY.replace("RSA ", "")}), (PEM_BODY[:40],)),
)  # fmt: skip
# the files that hold a private key (left out by their content, whatever their name)
BY_CONTENT = {"deploy/ci", "keys/server", "keys/login", "ci/gcp-runner.json", ".kube/config",
              "infra/terraform.tfstate"}  # fmt: skip


def stored(state: RepoState) -> str:
    return json.dumps(state.to_dict(), ensure_ascii=False)


def leaked(text: str, files=CREDENTIAL_FILES) -> list[str]:
    return [s for f in files for s in f.secrets if s in text]


def test_the_redactor_knows_every_credential_files_format():
    redactor = Redactor()
    for f in CREDENTIAL_FILES:
        if f.readable:
            out, n = redactor.redact(f.text)
            assert n >= 1 and not leaked(out, [f]), (f.path, out)


def test_a_session_snapshot_leaves_out_every_credential_file_by_name_or_content(tmp_path):
    root, home = repo(tmp_path / "repo"), tmp_path / "home"
    (root / ".docker").mkdir()
    (root / ".docker" / "config.json").write_text('{"auths": {}}\n')  # tracked, then changed
    (root / "conf").mkdir()
    (root / "conf" / "deploy key").write_text("to be filled in\n")  # tracked: a key by content
    git(root, "add", ".docker", "conf")
    git(root, "commit", "-qm", "docker")
    for f in CREDENTIAL_FILES:
        path = root / f.path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f.text)
    (root / "conf" / "deploy key").write_text(OPENSSH_KEY)
    record_start("s-1", root, home)
    record_end("s-1", root, home)
    for name in ("start.json", "end.json"):
        raw = (home / "sessions" / "s-1" / name).read_text()
        assert not leaked(raw), name
        state = RepoState.from_dict(json.loads(raw))
        missing = ({f.path for f in CREDENTIAL_FILES} | {"conf/deploy key"}) - set(state.left_out)
        assert not missing, missing
        assert "calc.py" not in state.left_out  # an ordinary file is still recorded


def test_what_a_snapshot_stores_passes_the_redactor(tmp_path):
    # the same contents under innocent names: recorded, and redacted before they are stored
    root = repo(tmp_path / "repo")
    names = {}
    for i, f in enumerate(CREDENTIAL_FILES):
        names[f.path] = f"notes/n{i}.txt"
        (root / "notes").mkdir(exist_ok=True)
        (root / names[f.path]).write_text(f.text)
    state = capture(root)
    text = stored(state)
    readable = [f for f in CREDENTIAL_FILES if f.readable]
    assert not leaked(text, readable), leaked(text, readable)
    by_content = [names[p] for p in BY_CONTENT]
    assert sorted(state.left_out) == sorted([".env", "keys/id_rsa", *by_content])  # and repo's
    for f in readable:
        if f.path not in BY_CONTENT:
            assert names[f.path] in state.diff  # recorded, its secrets redacted
    assert Redactor().redact(state.diff) == (state.diff, 0)


def test_a_rebuild_leaves_credential_files_of_the_commit_out(tmp_path):
    root = repo(tmp_path / "repo")
    for f in CREDENTIAL_FILES:
        path = root / f.path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f.text)
        git(root, "add", "-f", f.path)
    git(root, "commit", "-qm", "credentials")
    state = RepoState(str(root), ".", git(root, "rev-parse", "HEAD").strip(), "", 0.0)
    rebuilt = tmp_path / "rebuilt"
    materialise(state, rebuilt, 10 * 2**20)
    kept = sorted(str(p.relative_to(rebuilt)) for p in rebuilt.rglob("*") if p.is_file())
    assert kept == [".gitignore", "calc.py", "test_calc.py"]


def test_credentials_an_agent_read_in_its_session_are_redacted_in_the_log(tmp_path, log_at):
    # the SessionEnd hook's harvest: the agent `cat`s each credential file; the tool results
    # are stored in the task log (SQLite or PostgreSQL) only as the redactor leaves them
    from selftaught.sleep.intake.hooks import harvest_session
    from selftaught.sleep.intake.log import TaskLog

    base = {"sessionId": "s-creds", "cwd": "/w/app", "isSidechain": False}
    records = [
        {
            **base,
            "type": "user",
            "uuid": "u0",
            "message": {"role": "user", "content": "Why does the deploy fail?"},
        }
    ]
    readable = [f for f in CREDENTIAL_FILES if f.readable]
    for i, f in enumerate(readable):
        tool = {
            "type": "tool_use",
            "id": f"t{i}",
            "name": "Bash",
            "input": {"command": f"cat ~/{f.path}"},
        }
        result = {"type": "tool_result", "tool_use_id": f"t{i}", "content": f.text}
        records += [
            {**base, "type": "assistant", "uuid": f"a{i}",
             "message": {"role": "assistant", "model": "m", "content": [tool]}},
            {**base, "type": "user", "uuid": f"r{i}",
             "message": {"role": "user", "content": [result]}},
        ]  # fmt: skip
    records.append(
        {
            **base,
            "type": "assistant",
            "uuid": "end",
            "message": {
                "role": "assistant",
                "model": "m",
                "content": [{"type": "text", "text": "Found it."}],
            },
        }
    )
    path = tmp_path / "s-creds.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    log = TaskLog(log_at)
    assert harvest_session("claude-code", log, transcript=path).inserted == 1
    (row,) = log.query()
    log.close()
    text = json.dumps([row.messages, row.reply, row.meta], ensure_ascii=False)
    assert '\\"auths\\": {' in text and "[REDACTED:" in text  # the tool results are there...
    assert not leaked(text, readable), leaked(text, readable)  # ...its secrets are not


# ---- class 5: a rebuild writes only inside its folder -------------------------------------------


def hostile_commit(root: Path, tree: list) -> str:
    """A commit of `tree`, written as given (`git mktree` takes trees git itself never makes):
    each entry (mode, name, bytes) for a blob or a link, (mode, name, [entries]) for a
    folder."""

    def write(entries: list) -> str:
        lines = []
        for mode, name, content in entries:
            if isinstance(content, list):
                lines.append(f"040000 tree {write(content)}\t{name}\n")
                continue
            blob = subprocess.run(["git", "-C", str(root), "hash-object", "-w", "--stdin"],
                                  input=content, capture_output=True, check=True)  # fmt: skip
            lines.append(f"{mode} blob {blob.stdout.decode().strip()}\t{name}\n")
        made = subprocess.run(["git", "-C", str(root), "mktree"], input="".join(lines),
                              capture_output=True, text=True, check=True)  # fmt: skip
        return made.stdout.strip()

    return git(root, "commit-tree", write(tree), "-m", "hostile").strip()


def outside_tree(outside: Path) -> dict[str, list]:
    """Hostile trees, by the trick each plays."""
    file = ("100644", "pwned", b"written outside\n")
    link = str(outside).encode()
    return {
        "absolute link, file under it": [("120000", "link", link), ("040000", "link", [file])],
        "relative link": [("120000", "up", b"../../../../../../../../.." + link),
                          ("040000", "up", [file])],
        "deep link": [("040000", "a", [("120000", "b", link), ("040000", "b", [file])])],
        "link named like a folder after it": [("040000", "d", [file]), ("120000", "d", link),
                                              ("040000", "d", [("100644", "x", b"x\n")])],
    }  # fmt: skip


@pytest.mark.parametrize("trick", list(outside_tree(Path("/x"))))
def test_a_hostile_commit_is_refused_and_writes_nothing_outside(tmp_path, trick):
    root, outside = repo(tmp_path / "repo"), tmp_path / "outside"
    outside.mkdir()
    commit = hostile_commit(root, outside_tree(outside)[trick])
    state = RepoState(str(root), ".", commit, "", 0.0)
    with pytest.raises(RepoStateError, match="refused"):
        materialise(state, tmp_path / "rebuilt", 2**20)
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("trick", list(outside_tree(Path("/x"))))
def test_without_the_listings_check_the_writes_themselves_refuse_a_link(
    tmp_path, trick, monkeypatch
):
    # the second wall: each file is opened relative to its folder, no link followed
    from selftaught.sleep.intake import repo_state

    monkeypatch.setattr(repo_state, "_collision", lambda paths: None)
    root, outside = repo(tmp_path / "repo"), tmp_path / "outside"
    outside.mkdir()
    state = RepoState(str(root), ".", hostile_commit(root, outside_tree(outside)[trick]), "", 0.0)
    with pytest.raises(RepoStateError, match="refused"):
        materialise(state, tmp_path / "rebuilt", 2**20)
    assert list(outside.iterdir()) == []


def test_inside_never_follows_a_link_below_its_folder(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "real").mkdir(parents=True)
    outside.mkdir()
    (outside / "f").write_text("theirs\n")
    (root / "link").symlink_to(outside, target_is_directory=True)
    (root / "real" / "file-link").symlink_to(outside / "f")
    with Inside(root) as inside:
        for act in (
            lambda: inside.replace("link/f", b"mine\n"),
            lambda: inside.create("link/new", b"mine\n"),
            lambda: inside.read("link/f"),
            lambda: inside.remove("link/f"),
            lambda: inside.replace("real/file-link", b"mine\n"),
            lambda: inside.read("real/file-link"),
            lambda: inside.remove("real/file-link"),
            lambda: inside.symlink("real/file-link", "elsewhere"),
        ):
            with pytest.raises(PathRefused, match="symlink|twice"):
                act()
        inside.replace("real/new/f", b"mine\n")  # a plain folder: written, made private
        assert inside.read("real/new/f") == b"mine\n"
    assert (outside / "f").read_text() == "theirs\n" and sorted(outside.iterdir()) == [
        outside / "f"
    ]
    assert (root / "real" / "file-link").is_symlink()
    assert oct((root / "real" / "new").stat().st_mode & 0o777) == "0o700"
    with pytest.raises(PathRefused):
        path_parts("../x")


@pytest.mark.parametrize(
    "tree",
    [
        [("100644", "f", b"one\n"), ("100644", "f", b"two\n")],  # one path twice
        [("100644", "f", b"a file\n"), ("040000", "f", [("100644", "g", b"under it\n")])],
        [("040000", "f", [("100644", "g", b"under it\n")]), ("100644", "f", b"a file\n")],
    ],
    ids=["duplicate", "file then folder", "folder then file"],
)
def test_colliding_paths_are_refused(tmp_path, tree):
    root = repo(tmp_path / "repo")
    state = RepoState(str(root), ".", hostile_commit(root, tree), "", 0.0)
    with pytest.raises(RepoStateError, match="refused"):
        materialise(state, tmp_path / "rebuilt", 2**20)


def test_a_commits_own_links_are_rebuilt_as_links_and_a_patch_never_writes_through_one(tmp_path):
    root, outside = repo(tmp_path / "repo"), tmp_path / "outside"
    outside.mkdir()
    tree = [("100644", "README.md", b"hello\n"), ("120000", "docs", b"README.md"),
            ("120000", "out", str(outside).encode())]  # fmt: skip
    commit = hostile_commit(root, tree)
    rebuilt = tmp_path / "rebuilt"
    materialise(RepoState(str(root), ".", commit, "", 0.0), rebuilt, 2**20)
    assert (rebuilt / "docs").is_symlink() and (rebuilt / "docs").read_text() == "hello\n"
    assert (rebuilt / "out").is_symlink()
    patch = ("diff --git a/out/evil b/out/evil\nnew file mode 100644\nindex 0000000..1f2e3d4\n"
             "--- /dev/null\n+++ b/out/evil\n@@ -0,0 +1 @@\n+evil\n")  # fmt: skip
    with pytest.raises(RepoStateError):
        materialise(RepoState(str(root), ".", commit, patch, 0.0), tmp_path / "again", 2**20)
    assert list(outside.iterdir()) == []


# ---- class 6: write-back never goes through a symlink ------------------------------------------


def swap_for_link(folder: Path, outside: Path) -> None:
    """`folder` moved to `outside` (same bytes) and replaced by a symlink to it."""
    shutil.copytree(folder, outside, symlinks=True)
    shutil.rmtree(folder)
    folder.symlink_to(outside, target_is_directory=True)


def put_back(folder: Path, outside: Path) -> None:
    folder.unlink()
    shutil.copytree(outside, folder, symlinks=True)


def test_adopt_and_rollback_never_write_through_a_symlinked_folder_or_file(
    tmp_path, log_at, monkeypatch
):
    home, repo_dir = tmp_path / "home", tmp_path / "repo"
    monkeypatch.setenv("SELFTAUGHT_HOME", str(home))
    fruit, invoice = user_skill(repo_dir, "fruit-stall"), user_skill(repo_dir, "invoice-ledger")
    fill_two_intents(home, log_at)
    cfg = NightConfig(home=home, log_path=log_at, training=night_training_defaults(),
                      many_skills=True, skills_from=repo_dir, project=PROJECT)  # fmt: skip
    (night,) = run_night(cfg, models=two_rule_models())
    assert night.status == "staged", staging.read_report(night.night_dir)["reason"]
    claude, unit = repo_dir / ".claude", Unit(PROJECT, "fruit-stall")

    # adopt: REPO/.claude is now a symlink to a copy outside, same bytes
    swap_for_link(claude, tmp_path / "outside-1")
    copied = tmp_path / "outside-1" / "skills" / "fruit-stall" / "SKILL.md"
    before = copied.read_bytes()
    refused = cli_run("sleep", "adopt", "--skill", "fruit-stall", "--project", PROJECT)
    assert refused.exit_code != 0
    assert "symlink" in refused.output and str(claude) in refused.output, refused.output
    assert copied.read_bytes() == before and claude.is_symlink()
    assert staging.current_version(unit, home) == 0

    # adopt with the folder back; then a rollback through the symlinked folder is refused
    put_back(claude, tmp_path / "outside-1")
    done = cli_run("sleep", "adopt", "--skill", "fruit-stall", "--project", PROJECT)
    assert done.exit_code == 0, done.output
    adopted = fruit.read_bytes()
    swap_for_link(claude, tmp_path / "outside-2")
    copied = tmp_path / "outside-2" / "skills" / "fruit-stall" / "SKILL.md"
    back = cli_run("sleep", "rollback", "0", "--skill", "fruit-stall", "--project", PROJECT)
    assert back.exit_code == 1 and "refused" in back.output and "symlink" in back.output
    assert copied.read_bytes() == adopted and claude.is_symlink()

    # the SKILL.md itself a symlink to a same-bytes copy: refused, never replaced
    done = cli_run("sleep", "adopt", "--skill", "invoice-ledger", "--project", PROJECT)
    assert done.exit_code == 0, done.output
    outside, adopted = tmp_path / "outside-3.md", invoice.read_bytes()
    outside.write_bytes(adopted)
    invoice.unlink()
    invoice.symlink_to(outside)
    back = cli_run("sleep", "rollback", "0", "--skill", "invoice-ledger", "--project", PROJECT)
    assert back.exit_code == 1 and "symlink" in back.output, back.output
    assert invoice.is_symlink() and outside.read_bytes() == adopted


def test_a_start_document_is_checked_from_its_repository_root(tmp_path):
    repo_dir = tmp_path / "repo"
    (repo_dir / ".git").mkdir(parents=True)  # a repository: its root is where .git is
    doc = repo_dir / ".claude" / "CLAUDE.md"
    doc.parent.mkdir()
    doc.write_text("# Rules\n\nBe exact.\n")
    source = source_of(read_document(doc))
    assert source.root == str(repo_dir)
    swap_for_link(repo_dir / ".claude", tmp_path / "outside")
    copied = tmp_path / "outside" / "CLAUDE.md"
    with pytest.raises(WriteBackError, match="symlink"):
        write_back(source, "# Rules\n\nBe exacter.\n", tmp_path / "home")
    assert copied.read_text() == "# Rules\n\nBe exact.\n"

    # the root itself moved elsewhere since it was read: refused too
    put_back(repo_dir / ".claude", tmp_path / "outside")
    moved = tmp_path / "elsewhere"
    shutil.copytree(repo_dir, moved, symlinks=True)
    shutil.rmtree(repo_dir)
    repo_dir.symlink_to(moved, target_is_directory=True)
    with pytest.raises(WriteBackError, match="resolves"):
        write_back(source, "# Rules\n\nBe exacter.\n", tmp_path / "home")
    assert (moved / ".claude" / "CLAUDE.md").read_text() == "# Rules\n\nBe exact.\n"
