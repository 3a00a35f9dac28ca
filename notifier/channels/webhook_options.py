"""The webhook channel's settings: what a `[channels.NAME]` section of type webhook may say,
checked whenever notifier.toml loads. Apart from the channel (webhook.py), so that every
command can check them without loading httpx2 and standardwebhooks (start-up time)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from notifier.channels import options as o
from notifier.channels.base import Capabilities

DEFAULT_TIMEOUT_S = 10.0
# An ASSUMPTION about the receiver, not a fact: one that has not committed a request within
# timeout + query_delay after it left never will. Before that, a 404 from status_url does not
# prove "not sent" (the receiver may still be working on the request that timed out).
DEFAULT_QUERY_DELAY_S = 5.0


def _status_url(value: str) -> str | None:
    return o.http_url(value) or (None if "{key}" in value else "must contain {key}")


SCHEMA = o.Schema(
    {
        "url": o.Option("str", required=True, check=o.http_url),
        "status_url": o.Option("str", check=_status_url),
        "idempotent": o.Option("bool", default=False),
        "secret_env": o.env_name("secret_env", "HOOKS_SECRET", value_prefix="whsec_"),
        "timeout": o.Option("number", default=DEFAULT_TIMEOUT_S, check=o.seconds),
        "query_delay": o.Option("number", default=DEFAULT_QUERY_DELAY_S, check=o.delay),
        "rate": o.RATE,
        "window": o.WINDOW,
        "domain_rates": o.DOMAIN_RATES,
    }
)


def capabilities(definition: Mapping[str, Any]) -> Capabilities:
    """Idempotent only as the receiver's owner declares it; queryable with a status_url;
    thread-safe because httpx2's Client pools connections safely across threads."""
    return Capabilities(
        idempotent=bool(definition.get("idempotent", False)),
        queryable=definition.get("status_url") is not None,
        thread_safe=True,
    )
