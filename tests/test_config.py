"""notifier.toml is validated whole when it loads, against each channel type's own option
table: a bad definition exits 2 naming the section, the key and the nearest valid name, and
nothing is stored."""

from __future__ import annotations

import pytest

from .conftest import Workspace, make_rows

BAD = {
    "port_out_of_range": (
        '[channels.mail]\ntype = "smtp"\nhost = "127.0.0.1"\nport = 70000\n'
        'sender = "ops@example.com"\n',
        "`port` must be a port number from 1 to 65535",
    ),
    "timeout_not_a_number": (
        '[channels.hooks]\ntype = "webhook"\nurl = "http://127.0.0.1:9/x"\ntimeout = "ten"\n',
        "`timeout` must be a number, not 'ten'",
    ),
    "url_without_host": (
        '[channels.hooks]\ntype = "webhook"\nurl = "http://"\n',
        "`url` must be an http:// or https:// URL with a host",
    ),
    "malformed_host": (
        '[channels.hooks]\ntype = "webhook"\nurl = "http://a..b/x"\n',
        "`url` has a malformed host name 'a..b'",
    ),
    "misspelled_section": (
        "[retyr]\nmax_attempts = 2\n",
        "unknown section [retyr] (did you mean `retry`?)",
    ),
    "misspelled_key": (
        '[channels.hooks]\ntype = "webhook"\nurl = "http://127.0.0.1:9/x"\nidempotant = true\n',
        "unknown setting `idempotant` (did you mean `idempotent`?)",
    ),
    "misspelled_type": (
        '[channels.hooks]\ntype = "webhok"\nurl = "http://127.0.0.1:9/x"\n',
        "type 'webhok' (did you mean `webhook`?)",
    ),
    "smtp_without_sender": (
        '[channels.mail]\ntype = "smtp"\nhost = "127.0.0.1"\n',
        "missing `sender`",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
@pytest.mark.parametrize("dry_run", [False, True], ids=["send", "dry-run"])
def test_bad_configuration_exits_2_before_anything_is_stored(
    ws: Workspace, case: str, dry_run: bool
) -> None:
    """A definition that could not work is refused when the file loads, by send and by
    --dry-run alike, naming the problem; no database and no outbox appear."""
    text, expected = BAD[case]
    (ws.path / "notifier.toml").write_text(text)
    ws.write_csv("batch.csv", make_rows(3))
    result = ws.invoke("send", "batch.csv", *(["--dry-run"] if dry_run else []))
    assert result.exit_code == 2, result.output
    assert expected in result.output
    assert "notifier.toml" in result.output
    assert "Traceback" not in result.output
    assert not ws.db_file.exists()
    assert not ws.outbox.exists()


def test_a_refused_connection_is_not_sent_never_unknown(ws: Workspace) -> None:
    """A request that provably never left (connection refused) is not sent, even on a
    channel that cannot dedupe: never `unknown`, and never failed either (the channel is
    down, not the items): the run pauses with both pending, never attempted."""
    (ws.path / "notifier.toml").write_text(
        '[channels.hooks]\ntype = "webhook"\nurl = "http://127.0.0.1:1/n"\n'
        "[retry]\nmax_attempts = 2\nbackoff_base = 0.01\nbackoff_max = 0.02\n"
    )
    ws.write_csv("batch.csv", make_rows(2))
    result = ws.invoke("send", "batch.csv", "--channel", "hooks")
    assert result.exit_code == 3, result.output
    assert ws.query("SELECT state, SUM(attempts) FROM items GROUP BY state") == [("pending", 0)]
    assert ws.query("SELECT DISTINCT outcome FROM attempts") == [("not_sent",)]
    assert ws.query("SELECT state FROM runs") == [("paused",)]
