"""A night's start from the user's own files (`--start-document`, `--skills-from`).

`start_from` makes a file's text the skill the night starts from, as if it were the adopted
skill: consolidation edits it under the usual edit budget, the gate judges it against that
text, the staged proposal's skill.diff is against it, and report.json `start_document` records
the file as read (path, kind, sha256) so that adopting writes the adopted skill back into it
(`adoption/write_back.py`). The many-skills night reads `--skills-from` in `night/skills.py`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from selftaught.errors import ConfigError, InputError
from selftaught.sleep.adoption.placement import read_document, start_problem
from selftaught.sleep.adoption.write_back import source_of
from selftaught.sleep.paths import Adopted
from selftaught.sleep.result import NightDraft


def check_start_files(config: Any) -> None:
    """`NightConfig`'s start files, checked before a night runs."""
    if config.skills_from is not None:
        if not config.many_skills:
            raise ConfigError("skills_from (--skills-from REPO) goes with many_skills (--skills)")
        if not Path(config.skills_from).expanduser().is_dir():
            raise ConfigError(f"--skills-from {config.skills_from}: not a folder")
    if config.start_document is not None:
        if config.many_skills:
            raise ConfigError(
                "start_document (--start-document) starts the project's one skill; with "
                "--skills, start from the user's skills with --skills-from REPO"
            )
        if "skill" not in config.documents:
            raise ConfigError("start_document needs the skill among the documents trained")
        if not Path(config.start_document).expanduser().is_file():
            raise ConfigError(f"--start-document {config.start_document}: not a file")
    if (config.skills_from or config.start_document) and config.project is None:
        raise ConfigError(
            "--start-document / --skills-from: name the --project whose skills start from them"
        )


def start_from(night: NightDraft, adopted: Adopted, path: Path | None) -> Adopted:
    """`adopted` with the skill read from `path` (None: as it is), recorded in the night
    (`start_document`, a note when it replaces the adopted skill)."""
    if path is None:
        return adopted
    doc = read_document(path)
    problem = start_problem(doc)
    if problem is not None:
        raise InputError(problem)
    night.start_document = source_of(doc)
    if adopted.skill.strip() and adopted.skill.strip() != doc.text.strip():
        night.note(
            f"the skill starts from {doc.path}, not from the adopted version {adopted.version}"
        )
    return dataclasses.replace(adopted, skill=doc.text)
