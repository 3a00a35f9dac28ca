"""`reconcile --manual`: an operator settles unknown items with evidence, audited.

Interactive by default (one prompt per unknown item); `--item ID --mark … --evidence …` for
scripts. Every decision is a `decisions` row plus an event, written with the state change.
Ctrl-C between or during the prompts keeps every decision already recorded, records nothing
half-made, and exits 130 saying which decisions were recorded.
"""

from __future__ import annotations

from typing import Any

import click

from notifier.api import settling, working
from notifier.api.env import Env, open_store, pick_run
from notifier.cli.group import echo
from notifier.cli.outcome import error_message, renew_approval, send_again
from notifier.domain.errors import (
    BadInput,
    Interrupted,
    NeedsAttention,
    NextStep,
    NotifierError,
    Refused,
)
from notifier.domain.records import Counts, Item, Run
from notifier.domain.state_machine import FINISHED_RUN_STATES, ItemState, RunState
from notifier.ops import approval, report
from notifier.store import Store

_CHOICES = {"s": "sent", "n": "not-sent", "a": "abandon", "k": "skip", "q": "quit"}
# What each mark does, shown once before the first question.
_LEGEND = (
    "For each item: [s]ent = it was delivered (evidence required; never sent again); "
    "[n]ot sent = it was not delivered (it is sent again, under the same key on resume); "
    "[a]bandon = you cannot tell (it stays maybe delivered and is never sent again unless "
    "you later mark it not sent); s[k]ip = decide later; [q]uit."
)


def reconcile_manually(
    env: Env, run_id: str | None, item_ref: str | None, mark: str | None, evidence: str | None
) -> tuple[Run, Counts, RunState]:
    """The run, its counts and its state as `status` shows it (report.effective_state)
    once the decisions are recorded and the run let go of."""
    scripted = item_ref is not None or mark is not None or evidence is not None
    if scripted and not (item_ref and mark and evidence is not None):
        raise BadInput(
            "non-interactive use needs all three: --item ID --mark sent|not-sent|abandon "
            "--evidence TEXT."
        )
    store = open_store(env)
    decided: list[str] = []  # the decisions recorded, as the messages name them
    try:
        run = pick_run(store, run_id)
        try:
            return _settle_by_hand(env, store, run, item_ref, mark, evidence, decided)
        except NotifierError as exc:
            if decided and exc.then is NextStep.RESUME:
                # A storage failure after a decision was committed: it stands.
                raise NeedsAttention(_cut_short_after(run, decided, exc)) from exc
            raise
    finally:
        store.close()


def _settle_by_hand(
    env: Env,
    store: Store,
    run: Run,
    item_ref: str | None,
    mark: str | None,
    evidence: str | None,
    decided: list[str],
) -> tuple[Run, Counts, RunState]:
    """reconcile_manually's work on its open store, noting each decision in `decided` as it
    is committed."""
    with working.take_lease(store, run, env.config.lease_ttl_s) as lease:
        if item_ref is not None and mark is not None and evidence is not None:
            version = lease.version
            marked = settling.decide_by_hand(env, store, run, item_ref, mark, evidence, version)
            decided.append(f"item {marked.item_id} → {mark}")
            env.say(marked_message(marked))
        else:
            unknown = list(store.queries.items(run.run_id, [ItemState.UNKNOWN]))
            if not unknown:
                env.say(f"run {run.run_id} has no unknown items.")
            else:
                echo(_LEGEND)
            try:
                for item in unknown:
                    if not _ask_about(env, store, run, item, lease.version, decided):
                        break
            except KeyboardInterrupt:
                # A decision being written when it came was rolled back whole.
                settling.complete_if_done(store, run.run_id, lease.version)
                counts = store.queries.counts(run.run_id)
                raise Interrupted(_interrupted(run, decided, counts)) from None
        settling.complete_if_done(store, run.run_id, lease.version)
    counts = store.queries.counts(run.run_id)
    env.say(f"run {run.run_id}: {counts.summary()}")
    now = store.core.get_run(run.run_id)
    return now, counts, report.effective_state(store, now)


def _cut_short_after(run: Run, decided: list[str], exc: NotifierError) -> str:
    """A storage failure (`exc`, saying its cause and fix) that came after `decided` were
    committed: they stand, and what came after them (closing the run once nothing is left
    to settle, the next question) is what a manual reconcile of the run finishes. Never the
    same command again: an item already decided is refused."""
    return (
        f"{exc}. {len(decided)} decision(s) were recorded before it and stand "
        f"({'; '.join(decided)}); what the command did after them was not. Then run "
        f"`notifier reconcile --manual {run.run_id}`: it asks only about the items still "
        "unknown (none are asked twice) and closes the run once nothing is left to settle."
    )


def marked_message(marked: settling.Marked) -> str:
    """What an item settled by hand became, and what follows from it."""
    run, name = marked.run, f"item {marked.item_id} (seq {marked.seq})"
    again = f"`{send_again(run.batch_path, run.options)}`"
    if marked.released:
        return (
            f"{name} stays failed, now known never delivered: send the same file again "
            f"({again}) to send it; evidence recorded."
        )
    resend = f"send the same file again ({again}) to send it: only rows never delivered are sent"
    if run.state in FINISHED_RUN_STATES:
        not_sent = (
            f"pending; run {run.run_id} is {run.state.value}, so it will not send it: {resend}"
        )
    elif run.cancel_requested_at is not None:
        # A cancel was asked for and not finished (refused, cut short): the next resume or
        # cancel closes the run without sending anything more.
        not_sent = (
            f"pending; run {run.run_id} is being cancelled, so it will not send it: close it "
            f"with `notifier cancel {run.run_id}`, then {resend}"
        )
    elif approval.lapsed(run):
        # Its approval expired: `resume` is refused until the run is approved again.
        not_sent = (
            "pending (it will be sent with the same key on resume, once the run's expired "
            f"approval is renewed: {renew_approval(run.run_id)})"
        )
    else:
        not_sent = "pending (it will be sent with the same key on resume)"
    after = {
        "sent": "sent",
        "not-sent": not_sent,
        "abandon": "failed, maybe delivered: it is never sent again unless you mark it not-sent",
    }[marked.mark]
    return f"{name} → {after}; evidence recorded."


def _interrupted(run: Run, decided: list[str], counts: Counts) -> str:
    recorded = (
        f"{len(decided)} decision(s) recorded before it ({'; '.join(decided)})"
        if decided
        else "no decision was recorded"
    )
    return (
        f"interrupted (Ctrl-C): {recorded}; run {run.run_id} has {counts.unknown} unknown "
        f"item(s) left. `notifier reconcile --manual {run.run_id}` goes on with them."
    )


def _prompt(text: str, **kwargs: Any) -> Any:
    """click.prompt, except that Ctrl-C stays a KeyboardInterrupt (click turns it, like an
    end of input, into Abort): the end of input stops asking, Ctrl-C interrupts."""
    try:
        return click.prompt(text, **kwargs)
    except click.Abort as abort:
        if isinstance(abort.__context__, KeyboardInterrupt):
            raise KeyboardInterrupt from None
        raise


def _ask_about(
    env: Env, store: Store, run: Run, item: Item, version: int, decided: list[str]
) -> bool:
    """Show one unknown item and record the operator's decision (noted in `decided`); False
    to stop asking."""
    echo("")
    # The item as stored, never rewritten (group.echo completes suggested commands).
    click.echo(f"item {item.item_id} (seq {item.seq}) on channel {item.channel} → {item.target}")
    click.echo(f"  subject:  {item.payload.get('subject', '')}")
    click.echo(f"  key:      {item.idempotency_key}")
    click.echo(f"  digest:   {item.intent_digest}")
    click.echo(f"  attempts: {item.attempts}   last error: {item.last_error or '-'}")
    try:
        answer = _prompt(
            "  delivered? [s]ent / [n]ot sent / [a]bandon / s[k]ip / [q]uit",
            type=click.Choice(list(_CHOICES)),
            show_choices=False,
        )
    except click.Abort:
        return False
    decision = _CHOICES[answer]
    if decision == "quit":
        return False
    if decision == "skip":
        return True
    prompt = "  evidence (required)" if decision == "sent" else "  reason"
    try:
        evidence = _prompt(prompt, default="" if decision != "sent" else None)
        while decision == "sent" and not evidence.strip():
            evidence = _prompt(prompt)
    except click.Abort:
        return False
    evidence = evidence.strip() or f"operator chose {decision} without a stated reason"
    try:
        env.say(
            marked_message(
                settling.decide_by_hand(env, store, run, item.item_id, decision, evidence, version)
            )
        )
        decided.append(f"item {item.item_id} → {decision}")
    except Refused as refused:
        # A refused decision (a partial delivery marked not-sent) leaves the item as it was;
        # say why and go on to the next one.
        env.say(error_message(refused))
    return True
