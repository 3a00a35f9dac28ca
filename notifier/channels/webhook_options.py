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


def status_url_problem(value: str) -> str | None:
    return o.http_url(value) or (None if "{key}" in value else "must contain {key}")


def _in_the_file(key: str, check: o.Check) -> o.Option:
    """`url` or `status_url` as notifier.toml gives it: the file is copied into each run's
    channel snapshot and the URL quoted in the channel's errors, so a URL carrying a
    credential is refused (`{key}_env` takes it from the environment) and never quoted."""

    def checked(value: str) -> str | None:
        credential = o.url_credential(value)
        if credential is not None:
            return (
                f"carries a credential {credential}; notifier.toml is copied into each run's "
                "database and the URL quoted in the channel's errors, so put the whole URL in "
                f"an environment variable and name that variable with `{key}_env` instead "
                "(the URL is not shown)"
            )
        return check(value)

    return o.Option("str", check=checked, shown=o.shown_url)


def _one_url_each(definition: Mapping[str, Any]) -> list[str]:
    problems = []
    if ("url" in definition) == ("url_env" in definition):
        problems.append(
            "set `url` (the receiver's URL) or `url_env` (the name of an environment variable "
            "holding it, for a URL that is itself a secret), exactly one of them"
        )
    if "status_url" in definition and "status_url_env" in definition:
        problems.append("set `status_url` or `status_url_env`, not both")
    return problems


SCHEMA = o.Schema(
    {
        "url": _in_the_file("url", o.http_url),
        "url_env": o.env_name("url_env", "HOOKS_URL"),
        "status_url": _in_the_file("status_url", status_url_problem),
        "status_url_env": o.env_name("status_url_env", "HOOKS_STATUS_URL"),
        "idempotent": o.Option("bool", default=False),
        "secret_env": o.env_name("secret_env", "HOOKS_SECRET", value_prefix="whsec_"),
        "timeout": o.Option("number", default=DEFAULT_TIMEOUT_S, check=o.seconds),
        "query_delay": o.Option("number", default=DEFAULT_QUERY_DELAY_S, check=o.delay),
        "rate": o.RATE,
        "window": o.WINDOW,
        "domain_rates": o.DOMAIN_RATES,
    },
    _one_url_each,
)


def capabilities(definition: Mapping[str, Any]) -> Capabilities:
    """Idempotent only as the receiver's owner declares it; queryable with a status URL;
    thread-safe because httpx2's Client pools connections safely across threads."""
    return Capabilities(
        idempotent=bool(definition.get("idempotent", False)),
        queryable="status_url" in definition or "status_url_env" in definition,
        thread_safe=True,
    )
