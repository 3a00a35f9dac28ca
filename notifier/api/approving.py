"""Approving or rejecting a run planned with --require-approval, and who is at the keyboard
for the audit of every decision by hand."""

from __future__ import annotations

from notifier.api.env import Env, open_store, pick_run
from notifier.domain.errors import BadInput, Refused
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
        except approval.ApprovalUsage as exc:
            raise BadInput(str(exc)) from exc
        except approval.NotApproved:
            raise  # the command layer says what to do next
        except approval.ApprovalRefused as exc:
            raise Refused(str(exc)) from exc
        except LostRace as exc:
            raise Refused(
                f"run {run.run_id} changed while it was being approved "
                f"({exc}); nothing was "
                "approved. Review it again with `notifier status`, then approve.",
            ) from exc
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
            "changed since that preview. Nothing was approved. `notifier runs` lists the runs; "
            "`notifier preview RUN` shows a run's notifications with its fingerprint on the "
            "last line, and `notifier approve RUN --fingerprint sha256:…` approves that run."
        )
    if len(found) > 1:
        names = ", ".join(run.run_id for run in found)
        raise BadInput(
            f"runs {names} were planned with the same notifications, so the fingerprint alone "
            "does not say which one to approve; nothing was approved. Name it: `notifier "
            f"approve {found[0].run_id} --fingerprint sha256:…`."
        )
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
            advice = (
                "there is nothing to reject"
                if run.state in FINISHED_RUN_STATES
                else f"`notifier cancel {run.run_id}` stops it instead"
            )
            raise BadInput(
                f"run {run.run_id} is {run.state.value}, not awaiting approval, so it cannot be "
                f"rejected; {advice}."
            )
        store.ledger.reject_run(run.run_id, operator, reason.strip())
        return store.core.get_run(run.run_id), operator
    finally:
        store.close()
