"""Security round five: files (issue 63).

- **A rebuild writes only inside its folder.** A hostile commit (a symlink to a folder outside
  plus a file under it, colliding paths) is refused and writes nothing outside."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from selftaught.runs import Inside, PathRefused, path_parts
from selftaught.sleep.intake.repo_state import RepoState, RepoStateError, materialise
from tests.test_agent_workspace import git, repo

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
