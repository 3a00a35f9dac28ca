"""A batch sent to a downstream whose every answer halts the run, at any concurrency. At
N = 1 with one row that is one `send`; with more rows, unknown outcomes in a row
(RunOptions.unknown_streak_limit, "check the downstream") or a conflict halt the run and
leave the rows after them unsent, as at N = 8 with more rows than senders. An operator
then resumes; so does this, until every row has had its send, so that a test asserts its
promise of EVERY item, whichever command sent it."""

from __future__ import annotations

from collections.abc import Callable

from click.testing import Result

from .workspace import Workspace, make_rows


def send_through_halts(ws: Workspace, rows: int, n: int, channel: str) -> list[Result]:
    """`send` of `rows` rows to `channel` at --concurrency `n`, then `resume` at `n` for as
    long as the run halted with items pending; every command's result. Each resume must
    leave fewer pending (a resume that sends nothing would be a hang of its own)."""
    ws.write_csv("batch.csv", make_rows(rows))
    results = [ws.invoke("send", "batch.csv", "--channel", channel, "--concurrency", str(n))]
    pending = ws.ledger.state_counts().get("pending", 0)
    while pending:
        results.append(ws.invoke("resume", "--concurrency", str(n)))
        left = ws.ledger.state_counts().get("pending", 0)
        assert left < pending, [r.output for r in results]
        pending = left
    return results


def claimed_ahead(ws: Workspace) -> bool:
    """Whether some item was claimed and then given back unstarted: at a halt, the items
    claimed ahead of the senders are (pipeline.claim_ahead), so this shows that a test at
    N = 8 had items claimed ahead."""
    return any(a.outcome == "not_started" for a in ws.ledger.attempts())


def all_unknown_and_asked(
    ws: Workspace, asked: Callable[[str], int], rows: int, n: int
) -> dict[str, int]:
    """`send_through_halts` of `rows` rows to the scripted `hooks` channel whose every POST is
    uncertain and every status query inconclusive: every item ends unknown, every command
    exits 3, items were claimed ahead at N > 1, and each was asked (its three tries by the
    send; at N = 8 a resume after a halt asks those the halt left unknown again, and a query
    the halt cut short has fewer). How often each key was asked by then (`asked(key)`)."""
    results = send_through_halts(ws, rows, n, "hooks")
    said = [r.output for r in results]
    assert ws.ledger.states() == {f"u{i}": "unknown" for i in range(1, rows + 1)}, said
    assert [r.exit_code for r in results] == [3] * len(results), said
    assert claimed_ahead(ws) == (n > 1)
    keys = ws.ledger.keys()
    counts = {key: asked(key) for key in keys}
    assert all(counts.values()), said
    return counts
