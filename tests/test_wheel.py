"""A wheel that installs (docs/operations.md, README "Install"): `python -m build` makes the
sdist and, from it, the wheel; the wheel holds every file of the package (its prompts,
templates and type marker, not only its modules) and nothing else, and its metadata is
complete. scripts/check-wheel.sh (in .ci/run) installs that wheel into a fresh venv and runs
it; this test checks what it is made of (about 10 s)."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

pytest.importorskip("build", reason="the dev extra's `build` package makes the wheel")

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "selftaught"


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the sdist, the wheel built from it): offline, with the installed setuptools."""
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (sdist,) = out.glob("selftaught-*.tar.gz")
    (wheel,) = out.glob("selftaught-*.whl")
    return sdist, wheel


def package_files() -> set[str]:
    """Every file of the package in this tree, as the wheel names it (`selftaught/...`)."""
    tracked = subprocess.run(
        ["git", "ls-files", "src/selftaught"], cwd=ROOT, capture_output=True, text=True
    )
    if tracked.returncode == 0 and tracked.stdout.strip():
        names = tracked.stdout.split()
    else:  # not a git checkout (an unpacked sdist): what is on disk
        names = [str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*") if p.is_file()]
    return {
        n.removeprefix("src/")
        for n in names
        if "__pycache__" not in n and not n.endswith(".pyc") and (ROOT / n).exists()
    }


def test_the_wheel_holds_the_whole_package_and_nothing_else(dist):
    _, wheel = dist
    names = set(zipfile.ZipFile(wheel).namelist())
    info = {n for n in names if n.startswith("selftaught-") and ".dist-info/" in n}
    wanted = package_files()
    assert {n for n in wanted if not n.endswith(".py")}, "no data files found to compare"
    assert wanted - names == set(), "files of the package missing from the wheel"
    assert names - info - wanted == set(), "files in the wheel that the package does not have"


def test_the_wheels_metadata_is_complete(dist):
    import selftaught

    _, wheel = dist
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    with zipfile.ZipFile(wheel) as z:
        prefix = f"selftaught-{project['version']}.dist-info/"
        meta = Parser().parsestr(z.read(prefix + "METADATA").decode())
        entry_points = z.read(prefix + "entry_points.txt").decode()
        assert "Apache License" in z.read(prefix + "licenses/LICENSE").decode()
    assert meta["Name"] == "selftaught"
    assert meta["Version"] == project["version"] == selftaught.__version__
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta["Requires-Python"] == ">=3.10"
    assert meta["Summary"] and meta["Description-Content-Type"] == "text/markdown"
    assert "## Install" in meta.get_payload()  # the README is the long description
    classifiers = meta.get_all("Classifier")
    for wanted in ("Programming Language :: Python :: 3.10", "Typing :: Typed",
                   "Operating System :: POSIX :: Linux"):  # fmt: skip
        assert wanted in classifiers
    assert set(meta.get_all("Provides-Extra")) == set(project["optional-dependencies"])
    assert "selftaught = selftaught.cli:app" in entry_points.split("[console_scripts]")[1]


def test_the_sdist_builds_and_documents_itself_like_a_clone(dist):
    sdist, _ = dist
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for wanted in ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in", "Dockerfile",
                   "docs/operations.md", "scripts/check-wheel.sh", "tests/test_wheel.py",
                   "src/selftaught/skill/prompts/reflect_failures.md"):  # fmt: skip
        assert wanted in names, wanted
