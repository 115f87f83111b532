"""A skill package: SKILL.md plus the files beside it in `scripts/` and `references/`, the
layout Claude Code's and Codex's skills use, optimized whole.

The package lives in the skill's text, so that every part of optimization that works on a
text (versions, hashes, the val cache, the edit budget, the guard, protected regions, the
gate) works on the package unchanged: each file is a block after the rules, its text
verbatim between two marker lines,

    <!-- selftaught:file path=scripts/check.py -->
    print("the file's text, as it is")
    <!-- /selftaught:file -->

so a change to one line of a file is a change to one line of the skill. `exec` after the
path marks a file that was executable in the package the user gave (`optimize --skill DIR`);
a file an optimizer writes is never executable, and no file of a package is ever run by
selftaught: a script is model-written code, run only by an agent inside its own sandbox.

Files are plain UTF-8 text under `scripts/` or `references/` (paths of letters, digits,
`.`, `_`, `-` and `/`), at most MAX_FILE_BYTES each and MAX_FILES in all; a symlink, a
binary file or any other path in a package folder is refused when it is read, naming it."""

from __future__ import annotations

import os
import re
import shutil
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from selftaught.errors import InputError
from selftaught.runs import Inside, PathRefused, private_dirs

SKILL_FILE = "SKILL.md"
PACKAGE_DIRS = ("scripts", "references")
MAX_FILE_BYTES = 64 * 1024
MAX_FILES = 32
FILE_OPEN = "<!-- selftaught:file"
FILE_CLOSE = "<!-- /selftaught:file -->"
_PATH = re.compile(r"(?:scripts|references)(?:/[A-Za-z0-9_][A-Za-z0-9._-]{0,99}){1,4}")
_BLOCK = re.compile(
    r"^<!-- selftaught:file path=(\S+)( exec)? -->\n(.*?)^<!-- /selftaught:file -->\n?",
    re.DOTALL | re.MULTILINE,
)


class PackageError(InputError):
    """A skill package (or a file block of a skill) that cannot be read; the message names
    the file and why."""


@dataclass(frozen=True)
class PackageFile:
    """One file of a package: its path inside the package, its text, and whether the user's
    own package had it executable."""

    path: str
    text: str
    executable: bool = False

    def block(self) -> str:
        """The file as a block of the skill's text."""
        flag = " exec" if self.executable else ""
        body = self.text if self.text.endswith("\n") or not self.text else self.text + "\n"
        return f"{FILE_OPEN} path={self.path}{flag} -->\n{body}{FILE_CLOSE}\n"


def check_path(path: str) -> str:
    """`path` when it may name a package file, else PackageError saying why."""
    if not _PATH.fullmatch(path) or any(p.startswith(".") for p in path.split("/")):
        raise PackageError(
            f"{path!r}: a package file lives under {' or '.join(f'{d}/' for d in PACKAGE_DIRS)}"
            " with a plain name (letters, digits, '.', '_', '-'; no hidden names)"
        )
    return path


def check_text(path: str, data: bytes) -> str:
    """The file's text, or PackageError: too large, not UTF-8, or holding a marker line."""
    if len(data) > MAX_FILE_BYTES:
        raise PackageError(f"{path}: {len(data)} bytes, over the {MAX_FILE_BYTES} a file may hold")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise PackageError(f"{path}: not UTF-8 text (a package holds text files only)") from None
    if "\x00" in text:
        raise PackageError(f"{path}: not text (it holds NUL bytes)")
    if FILE_OPEN in text or FILE_CLOSE in text:
        raise PackageError(f"{path}: holds selftaught's file marker, which a file may not")
    return text


# ---- in the skill's text ------------------------------------------------------------------


def file_spans(text: str) -> list[tuple[int, int, str]]:
    """[start, end) of every file block in `text`, with the file's path."""
    return [(m.start(), m.end(), m.group(1)) for m in _BLOCK.finditer(text)]


def split_files(text: str) -> tuple[str, tuple[PackageFile, ...]]:
    """(`text` without its file blocks, the files). A block with a bad path is PackageError."""
    files = []
    for m in _BLOCK.finditer(text):
        files.append(PackageFile(check_path(m.group(1)), m.group(3), bool(m.group(2))))
    paths = [f.path for f in files]
    twice = sorted({p for p in paths if paths.count(p) > 1})
    if twice:
        raise PackageError(f"the skill holds {', '.join(twice)} twice")
    rest = _BLOCK.sub("", text)
    return (re.sub(r"\n{3,}", "\n\n", rest).strip("\n") + "\n" if rest.strip() else ""), tuple(
        files
    )


def check_blocks(text: str) -> None:
    """PackageError unless every marker line of `text` opens or closes a well-formed file
    block (a path a package file may have, each path once)."""
    blocks = split_files(text)[1]
    markers = sum(1 for line in text.split("\n") if line.startswith((FILE_OPEN, FILE_CLOSE)))
    if markers != 2 * len(blocks):
        raise PackageError("a file block's marker line is missing or out of place")


def keep_flags(text: str, before: str) -> str:
    """`text` with each file's `exec` flag as `before` had it for that path (a new path: not
    executable), whatever an edit did to the block's first line: only the user's own package
    makes a file executable."""
    flags = {m.group(1): bool(m.group(2)) for m in _BLOCK.finditer(before)}

    def header(m: re.Match[str]) -> str:
        flag = " exec" if flags.get(m.group(1), False) else ""
        return f"{FILE_OPEN} path={m.group(1)}{flag} -->\n{m.group(3)}{FILE_CLOSE}\n"

    return _BLOCK.sub(header, text)


def join_files(text: str, files: Iterable[PackageFile]) -> str:
    """`text` with the files' blocks after it, in path order."""
    blocks = "".join(f.block() + "\n" for f in sorted(files, key=lambda f: f.path)).rstrip("\n")
    if not blocks:
        return text
    return f"{text.rstrip()}\n\n{blocks}\n" if text.strip() else f"{blocks}\n"


# ---- on disk ------------------------------------------------------------------------------


def is_package(folder: Path) -> bool:
    """A folder holding SKILL.md (what `optimize --skill DIR` takes)."""
    return folder.is_dir() and (folder / SKILL_FILE).is_file()


def _package_paths(root: Path) -> list[str]:
    """Every entry under the package folders of `root`, relative, sorted (links listed, not
    followed)."""
    found = []
    for top in PACKAGE_DIRS:
        base = root / top
        if base.is_symlink():
            raise PackageError(f"{base} is a symlink; a package folder may not be one")
        for dirpath, dirs, files in os.walk(base):
            dirs.sort()
            links = [d for d in dirs if os.path.islink(os.path.join(dirpath, d))]
            for name in files + links:
                found.append(os.path.relpath(os.path.join(dirpath, name), root))
    return sorted(p.replace(os.sep, "/") for p in found)


def _read_one(inside: Inside, rel: str) -> PackageFile | None:
    """File `rel` of the package (None: gone), no symlink followed; PackageError if it
    cannot be a package file."""
    check_path(rel)
    try:
        st = inside.lstat(rel)
        data = inside.read(rel)
    except PathRefused as err:
        raise PackageError(str(err)) from None
    if st is None or data is None:
        return None
    if not stat.S_ISREG(st.st_mode):
        raise PackageError(f"{rel}: not a regular file")
    return PackageFile(rel, check_text(rel, data), bool(st.st_mode & 0o111))


def scan_files(root: Path) -> tuple[dict[str, PackageFile], list[tuple[str, str]]]:
    """The package files under `root`, and (path, why) for each entry refused: a symlink, a
    binary or oversized file, a path a package file may not have, one past MAX_FILES."""
    files: dict[str, PackageFile] = {}
    refused: list[tuple[str, str]] = []
    with Inside(root) as inside:
        for rel in _package_paths(root):
            if len(files) >= MAX_FILES:
                refused.append((rel, f"past the {MAX_FILES} files a package may hold"))
                continue
            try:
                found = _read_one(inside, rel)
            except PackageError as err:
                refused.append((rel, str(err)))
                continue
            if found is not None:
                files[rel] = found
    return files, refused


def read_files(root: Path) -> dict[str, PackageFile]:
    """The package files under `root`; PackageError naming the first that cannot be one."""
    files, refused = scan_files(root)
    if refused:
        raise PackageError(f"{root}: {refused[0][1]}")
    return files


def read_package(folder: str | Path) -> str:
    """A package folder as a skill's text: SKILL.md, then a block per file."""
    root = Path(folder)
    try:
        with Inside(root) as inside:
            data = inside.read(SKILL_FILE)
    except PathRefused as err:
        raise PackageError(str(err)) from None
    if data is None:
        raise PackageError(f"{root}: no {SKILL_FILE} (a skill package is a folder holding one)")
    text = check_text(str(root / SKILL_FILE), data)
    return join_files(text, read_files(root).values())


def write_files(root: Path, files: Iterable[PackageFile], *, executable: bool = True) -> None:
    """Create each file under `root` (which holds none of them yet), no symlink followed;
    `executable=False` leaves every file without its exec bit."""
    with Inside(root) as inside:
        for f in files:
            data = f.text.encode("utf-8")
            inside.create(check_path(f.path), data, executable=executable and f.executable)


def write_package(text: str, folder: str | Path) -> None:
    """A skill's text as a package folder (new, or empty): SKILL.md and its files."""
    root = Path(folder)
    rules, files = split_files(text)
    with Inside(root) as inside:
        inside.create(SKILL_FILE, rules.encode("utf-8"))
    write_files(root, files)


def export_package(text: str, folder: str | Path) -> bool:
    """The skill's package written afresh to `folder` (a folder of the run, replaced whole)
    when the skill holds files; False, and nothing written, when it holds none."""
    root = Path(folder)
    if not split_files(text)[1]:
        return False
    shutil.rmtree(root, ignore_errors=True)
    private_dirs(root)
    write_package(text, root)
    return True
