"""`domain_rates` holds sends per second per recipient DOMAIN: a recipient's domain is matched
against each key as domain_rates.domain_key spells both (lower case, no trailing dot, IDN as
punycode). A key no recipient's domain can ever be (a wildcard, a port, a scheme, a space)
is a rate that silently never applies: every row to that domain goes at the channel's own
pace. Two keys naming one domain (`Example.com` and `example.com.`) silently keep one of
the two rates. Both are configuration errors, exit 2 naming `domain_rates` when the
configuration loads, before anything is stored or sent."""

from __future__ import annotations

import pytest

from ..conftest import Workspace, make_rows

pytestmark = pytest.mark.timeout(60)

BOX = '[channels.box]\ntype = "outbox"\n'
NEVER_MATCH = {
    "wildcard": '"*.example.com" = 1',
    "port": '"example.com:25" = 1',
    "scheme": '"https://example.com" = 1',
    "space-inside": '"example .com" = 1',
    "path": '"example.com/" = 1',
    "one-domain-twice": '"Example.com" = 50, "example.com." = 1',
}


@pytest.mark.parametrize("case", sorted(NEVER_MATCH))
def test_a_domain_rate_no_recipient_can_match_exits_2_when_the_config_loads(
    ws: Workspace, case: str
) -> None:
    (ws.path / "notifier.toml").write_text(f"{BOX}domain_rates = {{ {NEVER_MATCH[case]} }}\n")
    batch = ws.write_csv("b.csv", make_rows(2))
    result = ws.invoke("send", str(batch), "--channel", "box")
    assert result.exit_code == 2, result.output
    message = result.output.strip()
    assert "domain_rates" in message and "notifier.toml" in message, message
    assert "internal error" not in message and "Traceback" not in message
    assert not ws.has_database()
    assert ws.outbox_documents() == []


@pytest.mark.parametrize(
    "keys",
    [
        '"Example.COM." = 1',
        '"bücher.example" = 1, "example.com" = 2',
        '"xn--bcher-kva.example" = 1',
    ],
)
def test_a_domain_rate_written_in_any_spelling_of_a_domain_is_accepted(
    ws: Workspace, keys: str
) -> None:
    """Case, a trailing dot and either spelling of an internationalised domain are spellings
    of one domain that domain_key reads: accepted."""
    (ws.path / "notifier.toml").write_text(
        f'[channels.box]\ntype = "outbox"\ndomain_rates = {{ {keys} }}\n'
    )
    batch = ws.write_csv("b.csv", make_rows(2))
    result = ws.invoke("send", str(batch), "--channel", "box", "--dry-run")
    assert result.exit_code == 0, result.output
