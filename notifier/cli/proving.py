"""`notifier verify`: parse, call verify.py, render. Exit 0 when every run checked holds
(keyed, unkeyed or unsigned), 5 when anything was found altered, 2 for a usage error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from notifier.api.env import Env, open_store, pick_run
from notifier.cli.group import cli, command_env, echo
from notifier.cli.output import json_flag
from notifier.domain.chain import KEY_ENV, ChainKind
from notifier.domain.errors import ExitCode
from notifier.domain.replay import Change, Difference, Table
from notifier.domain.verify import AuditVerdict, RunVerdict, verify

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
@click.argument("run_id", metavar="[RUN_ID | FILE]", required=False)
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
    Given a FILE that `notifier export` wrote, checks it alone, offline: every row's seal,
    each table against the manifest and the manifest's signature, then its run's chain and
    replay, the same way.

    \b
    Examples:
      notifier verify RUN          # keyed when NOTIFIER_AUDIT_KEY holds the run's key
      notifier verify audit.db     # an export, with no access to the database
      notifier verify --json | jq '.runs[] | select(.verdict == "altered")'
    """
    env = command_env(ctx, machine_output=as_json)
    if run_id is not None and Path(run_id).is_file():
        _verify_file(ctx, env, Path(run_id), as_json)
        return
    signer = env.config.signer()
    store = open_store(env, audited=True)
    try:
        run_ids = [pick_run(store, run_id).run_id] if run_id else store.audit.run_ids()
        verdicts = verify(store.audit, run_ids, signer)
    finally:
        store.close()
    if as_json:
        document = {"key_id": signer.key_id, "runs": [_as_json(v) for v in verdicts]}
        click.echo(_json_text(document))
    else:
        _print(verdicts, signer.key_id)
    if any(v.verdict is AuditVerdict.ALTERED for v in verdicts):
        ctx.exit(ExitCode.ALTERED)


def _json_text(document: object) -> str:
    """The document as JSON; with every character escaped where a value holds text no
    notifier wrote (not UTF-8, read back as surrogates), which no output could encode."""
    text = json.dumps(document, ensure_ascii=False, indent=2)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(document, indent=2)
    return text


def _verify_file(ctx: click.Context, env: Env, path: Path, as_json: bool) -> None:
    from notifier.api import Notifier  # noqa: PLC0415 (start-up time)

    checked = Notifier(env).verify_export(path)
    altered = bool(checked.findings) or any(v.verdict is AuditVerdict.ALTERED for v in checked.runs)
    if as_json:
        document = {
            "file": str(path), "sealed": checked.kind, "key_id": checked.key_id,
            "findings": [_finding_json(d) for d in checked.findings],
            "runs": [_as_json(v) for v in checked.runs],
        }  # fmt: skip
        click.echo(_json_text(document))
    else:
        key = f"key {checked.key_id}" if checked.key_id else "no key"
        state = "altered" if checked.findings else "its seals hold"
        if checked.key_id and checked.given_key_id is None and not checked.findings:
            state = "its tables agree with its manifest; no key given, so its seals are unchecked"
        echo(f"file {path}: sealed with {key}: {state}.")
        for finding in checked.findings:
            echo(f"  {describe(finding)}")
        _print(checked.runs, checked.given_key_id)
    if altered:
        ctx.exit(ExitCode.ALTERED)


def _print(verdicts: list[RunVerdict], key_id: str | None) -> None:
    if not verdicts:
        echo("no runs to verify.")
    if key_id is None:
        echo(f"no audit key given ({KEY_ENV}): keyed chains are checked for order only.")
    for v in verdicts:
        key = f", key {v.key_id}" if v.key_id else ""
        echo(f"run {v.run_id}: {v.verdict.value}{key} ({v.events} events): "
                   f"{_MEANING[v.verdict]}.")  # fmt: skip
        for finding in v.findings:
            echo(f"  {describe(finding)}")


def _file_finding(d: Difference, where: str) -> str | None:
    """A finding about an export's own structure, seals or manifest, as a line; None for
    any other."""
    if d.column == "damaged":
        return f"{where}: damaged, SQLite cannot read it ({d.stored}): not the file an export wrote"
    if d.column == "seal":
        return f"{where}: changed after it was exported (its seal is not its values')"
    if d.column == "rows" and d.expected == 1:
        return f"{where}: {d.stored} rows where an export writes one"
    if d.table is Table.SEAL and d.column == "rows":
        return f"{where}: rows that no export writes ({d.stored})"
    if d.table is Table.SEAL and d.column == "key_id":
        return (f"{where}: sealed with another key (id {d.stored}); the key given has id "
                f"{d.expected}")  # fmt: skip
    if d.table is Table.SEAL:
        return f"{where}: its manifest's signature does not hold"
    if d.table is Table.MANIFEST and d.column in ("table", "view", "trigger"):
        if d.stored is None:
            return f"{where}: missing (every export has this table)"
        return f"{where}: a {d.column} no export makes, added to the file"
    if d.table is Table.MANIFEST and d.column == "columns":
        return f"{where}: its columns are {d.stored}, an export's are {d.expected}"
    if d.table is Table.MANIFEST:
        return f"{where}: holds {d.column} {d.expected!r}, the manifest says {d.stored!r}"
    return None


def describe(d: Difference) -> str:
    """One finding as a line: the row, what is wrong with it, and the values."""
    where = f"{d.table.value}: {d.row}"
    said = _file_finding(d, where)
    if said is not None:
        return said
    if d.column == "audit_chain" and d.change is Change.MISSING:
        return f"{where}: its chain was removed (it was planned after its database began chaining)"
    if d.column == "audit_key_id":
        return (f"{where}: its events are keyed with another key (id {d.stored}); the key "
                f"given has id {d.expected}")  # fmt: skip
    if d.column == "audit_chain" and d.expected == ChainKind.KEYED:
        # Either a keyed run rewritten without the key, or a run honestly sent before the
        # key was adopted: nothing in the database tells the two apart.
        return (
            f"{where}: its events are not keyed ({d.stored} links), though a key was given: "
            "a keyed run rewritten by someone without the key reads so, and so does a run "
            "sent before the key was adopted, which `verify` without the key (no "
            f"{KEY_ENV}, no [audit] key_file) checks as unkeyed"
        )
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


def _finding_json(d: Difference) -> dict[str, Any]:
    return {"table": d.table.value, "row": d.row, "change": d.change.value, "column": d.column,
            "stored": d.stored, "expected": d.expected, "says": describe(d)}  # fmt: skip


def _as_json(v: RunVerdict) -> dict[str, Any]:
    return {
        "run_id": v.run_id,
        "verdict": v.verdict.value,
        "chain": v.chain,
        "key_id": v.key_id,
        "events": v.events,
        "findings": [_finding_json(d) for d in v.findings],
    }  # fmt: skip
