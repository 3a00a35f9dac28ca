"""Approving or rejecting a run planned with --require-approval, and who is at the keyboard
for the audit of every decision by hand."""

from __future__ import annotations

from notifier.api.env import Env, open_store, pick_run
from notifier.domain.errors import BadInput, NextStep, Refused
from notifier.domain.records import Run
from notifier.domain.state_machine import FINISHED_RUN_STATES, RunState
from notifier.domain.who import operator_name
from notifier.ops import approval
from notifier.store import LostRace, Store


def approve(
    env: Env, run_id: str | None, fingerprint: str, expires_in: str
) -> tuple[Run, approval.Approval]:
    """Approve run `run_id`, or without one the run waiting for approval whose fingerprint
    `fingerprint` is (never checked against any other run)."""
    try:
        span = approval.parse_duration(expires_in)
    except approval.ApprovalUsage as exc:
        raise BadInput(str(exc)) from exc
    store = open_store(env)
    try:
        run = (
            pick_run(store, run_id)
            if run_id is not None
            else _run_with_fingerprint(store, fingerprint)
        )
        try:
            return run, approval.approve(store, run, fingerprint, span, operator_name())
        except approval.NotApproved:
            raise  # the command layer says what to do next
        except approval.ApprovalRefused as exc:
            raise Refused(str(exc)) from exc
        except LostRace as exc:
            raise Refused(
                f"run {run.run_id} changed while it was being approved ({exc}); nothing was "
                "approved."
            ).advise(NextStep.REVIEW_THEN_APPROVE) from exc
    finally:
        store.close()


def _run_with_fingerprint(store: Store, fingerprint: str) -> Run:
    """The one unfinished run needing approval that was planned with `fingerprint`: exit 4
    when there is none (the refusal names no fingerprint), exit 2 when several share it."""
    found = [
        run
        for run in store.queries.runs_with_fingerprint(fingerprint.strip())
        if run.state not in FINISHED_RUN_STATES and approval.requires_approval(run)
    ]
    if not found:
        raise Refused(
            f"no run waiting for approval has fingerprint {approval.abridged(fingerprint)!r}: "
            "it was mistyped, copied from a run that is closed, or the run's notifications "
            "changed since that preview. Nothing was approved."
        ).advise(NextStep.FIND_RUN_TO_APPROVE)
    if len(found) > 1:
        names = ", ".join(run.run_id for run in found)
        raise BadInput(
            f"runs {names} were planned with the same notifications, so the fingerprint alone "
            "does not say which one to approve; nothing was approved."
        ).advise(NextStep.APPROVE_NAMED, found[0].run_id)
    return found[0]


def reject(env: Env, run_id: str | None, reason: str) -> tuple[Run, str]:
    """Close a run awaiting approval, nothing sent, with who rejected it, when and why in
    its audit trail. Without RUN_ID: the newest unfinished run."""
    if not reason.strip():
        raise BadInput("--reason is empty: say why the run is rejected (it is kept in its audit).")
    operator = operator_name()
    store = open_store(env)
    try:
        run = pick_run(store, run_id, active_only=run_id is None)
        if run.state is not RunState.AWAITING_APPROVAL:
            from notifier.ops.report import effective_state  # noqa: PLC0415 (a refusal only)

            shown = effective_state(store, run).value  # a killed run is paused, as status says
            why = f"run {run.run_id} is {shown}, not awaiting approval, so it cannot be rejected"
            awaiting = [r for r in store.core.runs() if r.state is RunState.AWAITING_APPROVAL]
            if run_id is None and awaiting:
                # Without RUN_ID the newest unfinished run was picked, and it is not the one
                # the operator can have meant: name the run that awaits approval, never a
                # cancel of a run nobody named (its rows would be left unsent).
                raise BadInput(
                    f"{why}; nothing was rejected. Without RUN_ID `reject` takes the newest "
                    f"unfinished run; {_awaiting(awaiting)}"
                ).advise(NextStep.REJECT_NAMED, awaiting[0].run_id)
            if run.state in FINISHED_RUN_STATES:
                raise BadInput(f"{why}; there is nothing to reject.")
            raise BadInput(why).advise(NextStep.CANCEL_INSTEAD, run.run_id)
        store.ledger.reject_run(run.run_id, operator, reason.strip())
        return store.core.get_run(run.run_id), operator
    finally:
        store.close()


def _awaiting(runs: list[Run]) -> str:
    """The runs awaiting approval (newest first), as a refusal of `reject` names them."""
    if len(runs) == 1:
        return f"run {runs[0].run_id} is the one awaiting approval."
    return f"runs {', '.join(r.run_id for r in runs)} await approval (newest first)."
