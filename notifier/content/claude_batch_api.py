"""What drafting and `notifier cancel` both ask of the Message Batches API about a run's
chunks: whose a batch is (its custom_id prefix), which batches may be a chunk's (listed by
time and size), and cancelling them. A chunk whose batch the API could not be asked about
stays open, so that `cancel` run again finishes it rather than claiming what it cannot know."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime

import anthropic

from notifier.content.claude_messages import without_key
from notifier.domain import clock
from notifier.domain.records import Run
from notifier.store import Store
from notifier.store.chunks import Chunk


def custom_prefix(run: Run) -> str:
    """The run's part of every custom_id: its key nonce, letters and digits only (custom_ids
    are 1-64 characters of [A-Za-z0-9_-]); `{prefix}_{chunk}_{seq}` stays under 40."""
    return "n" + re.sub(r"[^A-Za-z0-9]", "", run.key_nonce or run.run_id)[:16]


def custom_id_of(entry: object) -> str | None:
    """A results line's custom_id, or None when the line has none as text (a bad answer:
    the SDK builds its objects without checking them)."""
    custom_id = getattr(entry, "custom_id", None)
    return custom_id if isinstance(custom_id, str) else None


def carries(results: Iterable[object], mine: str) -> bool:
    """Whether any line of a batch's results has a custom_id starting with `mine`."""
    return any((custom_id_of(r) or "").startswith(mine) for r in results)


def nothing_made(exc: anthropic.APIError) -> bool:
    """An answer to `create` that proves no batch was made: a 4xx refusing the request,
    except 408 and 499 (the request may have been read before the connection ended)."""
    return (
        isinstance(exc, anthropic.APIStatusError)
        and 400 <= exc.status_code < 500
        and exc.status_code not in (408, 499)
    )


def listed_since(client: anthropic.Anthropic, since: datetime, count: int) -> list[str]:
    """Batches created since `since` with `count` requests, newest first. A batch whose
    creation time or request counts the listing does not give (a bad answer: the SDK
    builds its objects without checking them) may be one of them: only its results can
    tell, so it is listed too."""
    found = []
    for batch in client.messages.batches.list(limit=100):
        batch_id = getattr(batch, "id", None)
        created = getattr(batch, "created_at", None)
        if isinstance(created, datetime) and created < since:
            break
        total = _requests_in(getattr(batch, "request_counts", None))
        if isinstance(batch_id, str) and batch_id and total in (None, count):
            found.append(batch_id)
    return found


def _requests_in(counts: object) -> int | None:
    """How many requests a batch's counts add up to; None when they are not all numbers."""
    total = 0
    for kind in ("processing", "succeeded", "errored", "canceled", "expired"):
        n = getattr(counts, kind, None)
        if not isinstance(n, int):
            return None
        total += n
    return total


@dataclass(frozen=True)
class ChunkLeftOpen:
    """A chunk `cancel` left open: the Message Batches API could not be asked (`cause`)
    about its batch (`batch_id`, None while its creation is in doubt), so nothing is
    claimed about it and a later `cancel` finishes it. Said as the fact, advice aside."""

    run_id: str
    chunk: int
    batch_id: str | None
    cause: str

    def __str__(self) -> str:
        what = (
            f"its batch {self.batch_id} may still be running"
            if self.batch_id is not None
            else "its batch may have been created without its answer being recorded"
        )
        return (
            f"run {self.run_id}: chunk {self.chunk} was not cancelled: {what}, and the Message "
            f"Batches API could not be asked ({self.cause}). The chunk stays open, so nothing "
            "is claimed about it"
        )


def cancel_batches(
    store: Store, run_id: str, client: anthropic.Anthropic, say: Callable[[str], None]
) -> list[ChunkLeftOpen]:
    """Cancel the run's open chunks and record it (results already in stay stored). A chunk
    still `creating` may have a batch nobody recorded: the batches that may be its own are
    looked up as resume would and cancelled first. A chunk whose batch the API could not be
    asked about stays open, so `cancel` run again finishes it. Returns those left open."""
    mine = custom_prefix(store.core.get_run(run_id))
    left = []
    for chunk in store.chunks.chunks(run_id, ["creating", "submitted"]):
        try:
            if chunk.batch_id is not None:
                _cancel_batch(client, chunk.chunk, chunk.batch_id, say)
                ended = f"batch {chunk.batch_id} cancelled"
            else:
                found = _cancel_maybe_ours(client, chunk, f"{mine}_{chunk.chunk}_", say)
                ended = f"batch(es) {', '.join(found)} cancelled" if found else "no batch was made"
        except anthropic.APIError as exc:
            left.append(ChunkLeftOpen(run_id, chunk.chunk, chunk.batch_id, without_key(str(exc))))
            continue
        store.chunks.end_chunk(run_id, chunk.chunk, "canceled", f"cancelled at {clock.now_iso()}")
        say(f"chunk {chunk.chunk}: {ended}")
    return left


def _cancel_batch(
    client: anthropic.Anthropic, number: int, batch_id: str, say: Callable[[str], None]
) -> None:
    """Cancel one batch; a 4xx (e.g. it has ended) is said, anything else raised."""
    try:
        client.messages.batches.cancel(batch_id)
    except anthropic.APIStatusError as exc:
        if not nothing_made(exc):
            raise
        say(f"chunk {number}: batch {batch_id} not cancelled: {without_key(exc.message)}")


def _cancel_maybe_ours(
    client: anthropic.Anthropic, chunk: Chunk, mine: str, say: Callable[[str], None]
) -> list[str]:
    """The batches since the chunk's time bound with its request count: an ended one is
    the chunk's if its results carry `mine` (nothing left to cancel); one still running
    cannot be told before it ends, so it is cancelled as maybe the chunk's."""
    found = []
    since = datetime.fromisoformat(chunk.not_before)
    for batch_id in listed_since(client, since, chunk.request_count):
        batch = client.messages.batches.retrieve(batch_id)
        if batch.processing_status == "ended":
            if carries(client.messages.batches.results(batch_id), mine):
                say(f"chunk {chunk.chunk}: batch {batch_id} was its own and has ended")
            continue
        say(f"chunk {chunk.chunk}: batch {batch_id} may be its own (still running): cancelling")
        _cancel_batch(client, chunk.chunk, batch_id, say)
        found.append(batch_id)
    return found
