"""What `send` says about the runs before it: how the file's rows compared with them (a
Prior, counted by the store), worded with the commands that act on those runs."""

from __future__ import annotations

from notifier.api.planning import runs_named
from notifier.store import Prior
from notifier.store.history import ABANDONED, CHANGED, DELIVERED, RETRIED, SAME_CONTENT


def prior_summary(prior: Prior) -> list[str]:
    """The lines `send` prints about earlier runs: what was left out, and what is retried."""
    lines = []
    if prior.count(DELIVERED):
        lines.append(
            f"{prior.count(DELIVERED)} row(s) already delivered with the same content by "
            f"{runs_named(prior, DELIVERED)}: not sent again."
        )
    for run_id, n in prior.rejected_by.items():
        lines.append(
            f"{n} row(s) were rejected in run {run_id} (`notifier status {run_id}` says why "
            "and by whom): this run waits for approval before anything is sent."
        )
    if prior.count(ABANDONED):
        lines.append(
            f"{prior.count(ABANDONED)} row(s) abandoned by an operator in "
            f"{runs_named(prior, ABANDONED)} (maybe delivered): not sent again. To send one, "
            f"first mark it not sent there (`notifier reconcile {prior.runs(ABANDONED)[-1]} "
            "--manual --item ID --mark not-sent --evidence …`), then send the file again."
        )
    if prior.count(RETRIED):
        lines.append(
            f"{prior.count(RETRIED)} row(s) never delivered by earlier "
            f"{runs_named(prior, RETRIED)} (failed, expired, suppressed, cancelled or not "
            "sent): sent again, unless suppressed now."
        )
    if prior.count(CHANGED):
        lines.append(
            f"{prior.count(CHANGED)} row(s) changed since {runs_named(prior, CHANGED)} "
            "delivered them: sent again as new notifications (--resend-changed)."
        )
    if prior.count(SAME_CONTENT):
        lines.append(
            f"{prior.count(SAME_CONTENT)} row(s) with the content of rows "
            f"{runs_named(prior, SAME_CONTENT)} sent named otherwise (an `id` column added "
            "or dropped): sent again as new notifications (--resend-changed)."
        )
    return lines
