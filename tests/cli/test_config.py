"""notifier.toml is validated whole when it loads, against each channel type's own option
table: a bad definition exits 2 naming the section, the key and the nearest valid name, and
nothing is stored. So does a secret or URL list the environment lacks or gives unusable
(named, never shown), a lease TTL below its minimum and a number that is not finite or
beyond its setting's bound."""

from __future__ import annotations

import pytest

from ..conftest import Workspace, make_rows

pytestmark = pytest.mark.timeout(60)

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
    "misspelled_url_env": (
        '[channels.hooks]\ntype = "webhook"\nurl_evn = "HOOKS_URL"\n',
        "unknown setting `url_evn` (did you mean `url_env`?)",
    ),
    "url_and_url_env": (
        '[channels.hooks]\ntype = "webhook"\nurl = "http://127.0.0.1:9/x"\nurl_env = "X"\n',
        "set `url` (the receiver's URL) or `url_env`",
    ),
    "misspelled_type": (
        '[channels.hooks]\ntype = "webhok"\nurl = "http://127.0.0.1:9/x"\n',
        "type 'webhok' (did you mean `webhook`?)",
    ),
    "smtp_without_sender": (
        '[channels.mail]\ntype = "smtp"\nhost = "127.0.0.1"\n',
        "missing `sender`",
    ),
    # A domain rate's bucket is CHANNEL@DOMAIN: a channel named so would share it.
    "channel_name_with_at": (
        '[channels."mail@work"]\ntype = "outbox"\n',
        "a channel's name may not hold `@`",
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
    assert {(i.state, i.attempts) for i in ws.ledger.items()} == {("pending", 0)}
    assert {a.outcome for a in ws.ledger.attempts()} == {"not_sent"}
    assert ws.ledger.run().state == "paused"


@pytest.mark.both_stores
@pytest.mark.parametrize(
    ("channel", "environment", "named"),
    [
        (
            'type = "webhook"\nurl = "http://127.0.0.1:9/n"\nsecret_env = "HOOKS_SECRET"\n',
            {},
            "HOOKS_SECRET",
        ),
        (
            'type = "webhook"\nurl = "http://127.0.0.1:9/n"\nsecret_env = "HOOKS_SECRET"\n',
            {"HOOKS_SECRET": "not-a-signing-secret-9f8e7d"},
            "HOOKS_SECRET",
        ),
        (
            'type = "webhook"\nurl = "http://127.0.0.1:9/n"\nsecret_env = "HOOKS_SECRET"\n',
            {"HOOKS_SECRET": "whsec_!!!"},
            "HOOKS_SECRET",
        ),
        ('type = "apprise"\nurls_env = "ALERT_URLS"\n', {}, "ALERT_URLS"),
    ],
    ids=["secret-unset", "secret-invalid", "secret-empty", "urls-unset"],
)
def test_a_missing_or_bad_secret_from_the_environment_stores_nothing(
    ws: Workspace,
    monkeypatch: pytest.MonkeyPatch,
    channel: str,
    environment: dict[str, str],
    named: str,
) -> None:
    """A channel's secret or URL list from the environment that is unset or unusable exits 2
    before the run is stored, naming the variable and never its value."""
    monkeypatch.delenv("HOOKS_SECRET", raising=False)
    monkeypatch.delenv("ALERT_URLS", raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    (ws.path / "notifier.toml").write_text(f"[channels.hooks]\n{channel}")
    batch = ws.write_csv("b.csv", make_rows(2))
    result = ws.invoke("send", str(batch), "--channel", "hooks")
    assert result.exit_code == 2, result.output
    assert named in result.output and "Nothing was stored" in result.output
    assert "Traceback" not in result.output
    for value in environment.values():
        assert value not in result.output
    assert not ws.has_database() or ws.ledger.runs() == []


@pytest.mark.both_stores
@pytest.mark.parametrize("ttl", ["0.001", "1.5"])
def test_a_lease_ttl_below_the_minimum_is_refused_when_the_config_loads(
    ws: Workspace, ttl: str
) -> None:
    """`[lease] ttl` below 2 seconds exits 2 at load, naming the setting, why and the fix,
    before anything is stored; 2 itself is accepted."""
    (ws.path / "notifier.toml").write_text(f"[lease]\nttl = {ttl}\n")
    batch = ws.write_csv("b.csv", make_rows(2))
    result = ws.invoke("send", str(batch))
    assert result.exit_code == 2, result.output
    message = result.output.strip()
    assert len(message.splitlines()) == 1, message
    assert "[lease] ttl" in message and "minimum of 2 seconds" in message
    assert "Set `ttl` to 2 or more" in message and "Traceback" not in message
    assert not ws.has_database()
    (ws.path / "notifier.toml").write_text("[lease]\nttl = 2\n")
    assert ws.invoke("send", str(batch)).exit_code == 0


HOOKS = '[channels.hooks]\ntype = "webhook"\nurl = "http://127.0.0.1:9/n"\n'
OUT_OF_BOUNDS = {
    "lease-ttl-inf": ("[lease]\nttl = inf\n", "[lease] ttl"),
    "lease-ttl-nan": ("[lease]\nttl = nan\n", "[lease] ttl"),
    "lease-ttl-1e300": ("[lease]\nttl = 1e300\n", "[lease] ttl"),
    "backoff-base-inf": ("[retry]\nbackoff_base = inf\n", "[retry] backoff_base"),
    "backoff-max-inf": ("[retry]\nbackoff_max = inf\n", "[retry] backoff_max"),
    "backoff-base-negative": ("[retry]\nbackoff_base = -1\n", "[retry] backoff_base"),
    "deadline-nan": ("[retry]\ndeadline = nan\n", "[retry] deadline"),
    "deadline-1e300": ("[retry]\ndeadline = 1e300\n", "[retry] deadline"),
    "max-attempts-inf": ("[retry]\nmax_attempts = inf\n", "[retry] max_attempts"),
    "down-after-huge": ("[retry]\ndown_after = 1e30\n", "[retry] down_after"),
    "timeout-inf": (f"{HOOKS}timeout = inf\n", "`timeout`"),
    "query-delay-1e300": (f"{HOOKS}query_delay = 1e300\n", "`query_delay`"),
    "rate-nan": (f"{HOOKS}rate = nan\n", "`rate`"),
    "rate-1e-12": (f"{HOOKS}rate = 1e-12\n", "`rate`"),
    "domain-rate-1e-12": (
        f'{HOOKS}domain_rates = {{ "gmail.com" = 1e-12 }}\n',
        "`domain_rates`",
    ),
}


@pytest.mark.parametrize("case", sorted(OUT_OF_BOUNDS))
def test_a_number_that_is_not_finite_or_beyond_its_bound_is_refused_when_the_config_loads(
    ws: Workspace, case: str
) -> None:
    """Every number notifier.toml gives is finite and within its setting's range (`inf`,
    `nan` or 1e300 seconds would overflow the first time a lease, a retry or a rate is
    timed, after the run was stored): exit 2 at load, naming the setting and its range,
    in one paragraph, before anything is stored."""
    text, named = OUT_OF_BOUNDS[case]
    (ws.path / "notifier.toml").write_text(text)
    batch = ws.write_csv("b.csv", make_rows(2))
    result = ws.invoke("send", str(batch), "--channel", "hooks" if "hooks" in text else "outbox")
    assert result.exit_code == 2, result.output
    message = result.output.strip()
    assert named in message and "notifier.toml" in message, message
    assert "internal error" not in message and "Traceback" not in message
    assert not ws.has_database()
