"""A batch sent to a downstream whose every answer halts the run, at any concurrency. At
N = 1 with one row that is one `send`; with more rows, unknown outcomes in a row
(RunOptions.unknown_streak_limit, "check the downstream") or a conflict halt the run and
leave the rows after them unsent, as at N = 8 with more rows than senders. An operator
then resumes; so does this, until every row has had its send, so that a test asserts its
promise of EVERY item, whichever command sent it."""

from __future__ import annotations

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
