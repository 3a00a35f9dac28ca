"""`notifier verify`: parse, call verify.py, render. Exit 0 when every run checked holds
(keyed, unkeyed or unsigned), 5 when anything was found altered, 2 for a usage error."""

from __future__ import annotations

import json
from typing import Any

import click

from ..chain import KEY_ENV, ChainKind
from ..env import open_store, pick_run
from ..errors import ExitCode
from ..replay import Change, Difference, Table
from ..verify import AuditVerdict, RunVerdict, verify
from .group import cli, command_env
from .output import json_flag

# What each verdict proves, as the report says it.
_MEANING = {
    AuditVerdict.KEYED: (
        "every event checked with the audit key; the rows are what the events say"
    ),
    AuditVerdict.UNKEYED: (
        "checked without a key: it catches accidents (a lost write, truncation, a bad "
        "disk), not someone who rewrote the database"
    ),
    AuditVerdict.UNSIGNED: (
        "written before the event chain existed: there is nothing to check it against, and "
        "nothing was found altered"
    ),
    AuditVerdict.ALTERED: "altered after it was written",
}


@cli.command(name="verify")
@click.argument("run_id", required=False)
@json_flag("Print one JSON object: each run's verdict and every finding.")
@click.pass_context
def verify_command(ctx: click.Context, run_id: str | None, as_json: bool) -> None:
    """Check that runs were not altered after they were written (default: every run).

    Checks each run's chain of events, with the audit key when one is set (NOTIFIER_AUDIT_KEY,
    or [audit] key_file in notifier.toml), then rebuilds its items, attempts, receipts and
    manual decisions from its events and compares them with the stored rows. Names every
    event missing, edited, inserted or moved, a chain keyed with another key, and every row
    that differs. Read-only. Exit 0: everything holds; 5: something was altered.

    \b
    Examples:
      notifier verify RUN          # keyed when NOTIFIER_AUDIT_KEY holds the run's key
      notifier verify --json | jq '.runs[] | select(.verdict == "altered")'
    """
    env = command_env(ctx, machine_output=as_json)
    signer = env.config.signer()
    store = open_store(env, audited=True)
    try:
        run_ids = [pick_run(store, run_id).run_id] if run_id else store.audit.run_ids()
        verdicts = verify(store.audit, run_ids, signer)
    finally:
        store.close()
    if as_json:
        document = {"key_id": signer.key_id, "runs": [_as_json(v) for v in verdicts]}
        click.echo(json.dumps(document, ensure_ascii=False, indent=2))
    else:
        _print(verdicts, signer.key_id)
    if any(v.verdict is AuditVerdict.ALTERED for v in verdicts):
        ctx.exit(ExitCode.ALTERED)


def _print(verdicts: list[RunVerdict], key_id: str | None) -> None:
    if not verdicts:
        click.echo("no runs to verify.")
    if key_id is None:
        click.echo(f"no audit key given ({KEY_ENV}): keyed chains are checked for order only.")
    for v in verdicts:
        key = f", key {v.key_id}" if v.key_id else ""
        click.echo(f"run {v.run_id}: {v.verdict.value}{key} ({v.events} events): "
                   f"{_MEANING[v.verdict]}.")  # fmt: skip
        for finding in v.findings:
            click.echo(f"  {describe(finding)}")


def describe(d: Difference) -> str:
    """One finding as a line: the row, what is wrong with it, and the values."""
    where = f"{d.table.value}: {d.row}"
    if d.column == "audit_key_id":
        return (f"{where}: its events are keyed with another key (id {d.stored}); the key "
                f"given has id {d.expected}")  # fmt: skip
    if d.column == "audit_chain" and d.expected == ChainKind.KEYED:
        return f"{where}: its events are not keyed ({d.stored} links), though a key was given"
    if d.change is Change.MISSING:
        if d.column:
            return f"{where}: {d.column} missing"
        if d.table is Table.EVENTS:
            return f"{where}: missing (the run's event numbers skip it)"
        return f"{where}: missing (the events say it should exist)"
    if d.change is Change.EXTRA:
        if d.column:
            return f"{where}: has a {d.column} it should not have ({d.stored!r})"
        return f"{where}: stored, but no event made it"
    if d.change is Change.ILLEGAL:
        return f"{where}: {d.column} {d.stored!r} does not allow {d.expected!r}"
    return f"{where}: {d.column} is {d.stored!r}, expected {d.expected!r}"


def _as_json(v: RunVerdict) -> dict[str, Any]:
    return {
        "run_id": v.run_id,
        "verdict": v.verdict.value,
        "chain": v.chain,
        "key_id": v.key_id,
        "events": v.events,
        "findings": [
            {"table": d.table.value, "row": d.row, "change": d.change.value, "column": d.column,
             "stored": d.stored, "expected": d.expected, "says": describe(d)}
            for d in v.findings
        ],
    }  # fmt: skip
