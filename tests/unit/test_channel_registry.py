"""The channel registry: one entry per type, whose schema, capabilities and builder agree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from notifier.channels import build_channel, capabilities, definition_problems, target_problem
from notifier.channels.registry import TYPES

# A usable definition of every type, built without any network (nothing is sent).
DEFINITIONS: list[dict[str, Any]] = [
    {"type": "outbox"},
    {"type": "webhook", "url": "http://127.0.0.1:9/n"},
    {
        "type": "webhook",
        "url": "http://127.0.0.1:9/n",
        "status_url": "http://127.0.0.1:9/s/{key}",
        "idempotent": True,
    },
    {"type": "smtp", "host": "127.0.0.1", "port": 9, "sender": "ops@example.com"},
    {"type": "apprise", "urls": ["json://127.0.0.1:9/notify"]},
]


def test_every_registered_type_has_a_definition_here() -> None:
    """A new channel type must be added to this file's definitions, so the checks below
    cover it too."""
    assert {d["type"] for d in DEFINITIONS} == set(TYPES)


@pytest.mark.parametrize("definition", DEFINITIONS, ids=lambda d: str(sorted(d.items())))
def test_a_built_channel_has_the_capabilities_its_registry_entry_states(
    definition: dict[str, Any], tmp_path: Path
) -> None:
    """What the registry says a definition promises (without building it) is exactly what
    the channel built from it promises: the runner and the judge read the latter."""
    assert definition_problems("test", definition) == []
    if definition["type"] == "apprise":
        pytest.importorskip("apprise")
    channel = build_channel("c", dict(definition), tmp_path)
    try:
        promised = capabilities(definition)
        assert (channel.idempotent, channel.queryable, channel.thread_safe) == promised
    finally:
        channel.close()


def test_webhook_capabilities_follow_its_definition() -> None:
    """A webhook is idempotent only when declared so, and queryable only with a status_url."""
    plain, full = DEFINITIONS[1], DEFINITIONS[2]
    assert (capabilities(plain).idempotent, capabilities(plain).queryable) == (False, False)
    assert (capabilities(full).idempotent, capabilities(full).queryable) == (True, True)


def test_an_unknown_type_is_refused_naming_the_registered_ones(tmp_path: Path) -> None:
    """A definition of a type nobody registered is a configuration problem listing the
    known types (with a suggestion), and cannot be built."""
    [problem] = definition_problems("channel 'x'", {"type": "webhok"})
    assert "did you mean `webhook`?" in problem
    assert ", ".join(sorted(TYPES)) in problem
    with pytest.raises(Exception, match="unknown type 'webhok'"):
        build_channel("x", {"type": "webhok"}, tmp_path)


def test_only_smtp_and_apprise_constrain_a_rows_target() -> None:
    """Planning refuses a row whose `to` an smtp channel would refuse, or that an apprise
    channel would read as a list; other types take any target as it is."""
    assert target_problem("smtp", "ops@example.com", "mail") is None
    problem = target_problem("smtp", "not an address", "mail")
    assert problem is not None and "is not an e-mail address, which channel 'mail'" in problem
    assert target_problem("apprise", "ops@example.com", "alerts") is None
    listed = target_problem("apprise", "a@example.com,b@example.com", "alerts")
    assert listed is not None and "holds a list" in listed
    for kind in set(TYPES) - {"smtp", "apprise"}:
        assert target_problem(kind, "not an address", "c") is None
