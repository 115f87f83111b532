"""`doctor`: this machine's cores, busy estimate, threads, bf16 choice and raw decode rate
(`selftaught.doctor`)."""

from __future__ import annotations

from typing import Annotated

import typer

from selftaught.cli.common import app, friendly_errors, out
from selftaught.runs import json_text


@app.command("doctor")
@friendly_errors
def doctor_cmd(
    model: Annotated[
        str, typer.Option("--model", "-m", help="The local model: local or local:PATH.")
    ] = "local",
    measure: Annotated[
        bool,
        typer.Option(
            "--measure/--no-measure", help="Time the raw decode rate (about 10-20 s on a CPU)."
        ),
    ] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """This machine for the local model: cores, busy ones, threads, bf16, raw decode rate.

    Also the README's main command's expected time here (its measured time scaled by the
    ratio of raw decode rates)."""
    from selftaught.doctor import diagnose, local_path, measure_raw_rate, report_lines

    path = local_path(model)
    report = diagnose((lambda: measure_raw_rate(path)) if measure else None)
    if as_json:
        out.print_json(json_text(report.to_dict()))
        return
    for line in report_lines(report):
        out.print(line, highlight=False, soft_wrap=True)
