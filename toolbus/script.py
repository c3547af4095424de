"""Scripted conversations: a YAML file of steps run against any toolbus server (SPEC K3).

A script is a conversation over one raw WebSocket: the runner sends exactly what the
file says and matches what comes back, so it can test any server that speaks protocol
``toolbus.v1``, including with bad input. The format is documented in
``docs/scripts.md``; in short::

    name: sync invoke
    connect: {token: alice-token, profile: demo}     # optional; hello sent for you
    steps:
      - send: {type: invoke, call_id: c1, tool: convert_units,
               params: {value: 1, from_unit: km, to_unit: m}}
      - expect: {type: result, call_id: c1, result: {result: 1000.0}, seq: {capture: s}}
        timeout: 5

Step kinds (one per step): ``send``, ``send_raw``, ``send_bytes_hex``,
``send_binary_hex``, ``expect`` (options ``timeout``, ``strict``, ``forbid``),
``expect_close``, ``disconnect``, ``resume``, ``elicit`` (answer a running tool's
``elicit.request``: ``{request: pattern, action: accept|decline|cancel, content,
result: pattern}``, SPEC M3). There is no ``sleep``: ordering comes from expectations.
Matchers inside ``expect``: a literal (equality), ``{regex: ...}``, ``{any: true}``,
``{absent: true}``, ``{contains: pattern}`` (a list element matches),
``{capture: name}`` (store the value; later ``${name}`` is replaced by it); nested
objects match as subsets, lists element by element.

Entry points: :func:`run_file` (one file, returns a :class:`ScriptReport`) and
:func:`main` for ``toolbus run FILE... --url URL [--token T]``.

The parts, one module each: :mod:`toolbus.script_format` (reading and checking a file),
:mod:`toolbus.script_match` (matchers and ``${name}`` substitution),
:mod:`toolbus.script_runner` (running the steps, the reports); this module holds the
command line and re-exports their public names, so ``toolbus.script.X`` keeps working.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

from toolbus.script_format import DEFAULT_TIMEOUT as DEFAULT_TIMEOUT
from toolbus.script_format import KINDS as KINDS
from toolbus.script_format import OPTIONS as OPTIONS
from toolbus.script_format import Script as Script
from toolbus.script_format import ScriptError as ScriptError
from toolbus.script_format import Step as Step
from toolbus.script_format import load_script as load_script
from toolbus.script_match import MATCHER_KEYS as MATCHER_KEYS
from toolbus.script_match import StepFailed as StepFailed
from toolbus.script_match import match as match
from toolbus.script_match import substitute as substitute
from toolbus.script_runner import RUNNERS as RUNNERS
from toolbus.script_runner import SUBPROTOCOL as SUBPROTOCOL
from toolbus.script_runner import Conversation as Conversation
from toolbus.script_runner import Runner as Runner
from toolbus.script_runner import ScriptReport as ScriptReport
from toolbus.script_runner import StepResult as StepResult
from toolbus.script_runner import run_file as run_file
from toolbus.script_runner import run_files as run_files
from toolbus.script_runner import run_script as run_script


def main(argv: Sequence[str] | None = None) -> int:
    """``toolbus run FILE... --url URL [--token T]``: run scripts, print each step.

    Returns:
        0 when every script passed, 1 otherwise.
    """
    parser = argparse.ArgumentParser(
        prog="toolbus run", description="Run scripted toolbus conversations (SPEC K3)."
    )
    parser.add_argument("files", nargs="+", type=Path, help="script files (YAML)")
    parser.add_argument(
        "--url", required=True, help="server WebSocket URL, e.g. ws://127.0.0.1:8765/"
    )
    parser.add_argument(
        "--token", default=None, help="credential; overrides each file's connect.token"
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="print only failed steps")
    args = parser.parse_args(list(argv) if argv is not None else None)
    reports = asyncio.run(run_files(args.files, args.url, args.token))
    for report in reports:
        print(report.render(verbose=not args.quiet))
    failed = sum(1 for r in reports if not r.passed)
    print(f"{len(reports) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
