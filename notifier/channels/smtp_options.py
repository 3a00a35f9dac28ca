"""The smtp channel's settings, checked whenever notifier.toml loads, and the address rules
they share with sending and with planning (an address the channel would refuse fails the
batch file, not the run). Apart from the channel (smtp.py), so that every command can check
them without loading smtplib, ssl and the email package (start-up time)."""

from __future__ import annotations

import base64
import ipaddress
import os
import re
from collections.abc import Mapping
from typing import Any

from notifier.channels import options as o
from notifier.channels.base import Capabilities, ChannelConfigError
from notifier.domain.intent import unsubscribe_mailto, unsubscribe_url
from notifier.domain.suppression import misdotted, registered_spelling
from notifier.domain.text import control_character

DEFAULT_TIMEOUT_S = 30.0
_ADDRESS_FORBIDDEN = re.compile(r"[\s<>,;\"()\[\]\\]")
# What a batch file's `to` must look like before the stricter rules below are asked.
_EMAIL = re.compile(r"^[^@\s<>,;\"]+@[^@\s<>,;\"]+\.[^@\s<>,;\"]+$")
# SMTP cannot dedupe (a re-send is a second e-mail), nor can it be asked whether it holds a
# message. Its senders each take a connection of the channel's pool (smtp_pool.py), so
# several send at once; with max_connections = 1, one at a time (not thread-safe: the
# runner keeps one item in flight).
CAPABILITIES = Capabilities(idempotent=False, queryable=False, thread_safe=True)


def capabilities(definition: Mapping[str, Any]) -> Capabilities:
    if definition.get("max_connections") == 1:
        return CAPABILITIES._replace(thread_safe=False)
    return CAPABILITIES


def requires_unsubscribe(definition: Mapping[str, Any]) -> bool:
    """Whether every row sent through this channel must carry an unsubscribe address."""
    return definition.get("require_unsubscribe") is True


def list_unsubscribe(url: str | None, mailto: str | None) -> list[tuple[str, str]] | str:
    """The RFC 2369 / RFC 8058 headers for a message, checked again as they are sent (the
    payload was checked when planned): `List-Unsubscribe: <https://…>, <mailto:…>`, and
    `List-Unsubscribe-Post: List-Unsubscribe=One-Click` whenever there is an https URL
    (one-click is defined for https only). A problem as a string."""
    uris: list[str] = []
    for value, check, column in (
        (url, unsubscribe_url, "unsubscribe_url"),
        (mailto, unsubscribe_mailto, "unsubscribe_mailto"),
    ):
        if value is None:
            continue
        try:
            if check(value) != value:
                raise ValueError("is not in the form planning stores")
        except ValueError as exc:
            return f"the stored `{column}` {exc}"
        uris.append(f"<{value}>")
    if not uris:
        return []
    # One line when it fits in 78 characters (RFC 5322 2.1.1), else folded between the two
    # URIs: each is at most 900 characters, so no line passes the hard limit of 998.
    joined = ", ".join(uris)
    if len("List-Unsubscribe: ") + len(joined) > 78:
        joined = ",\r\n ".join(uris)
    headers = [("List-Unsubscribe", joined)]
    if url is not None:
        headers.append(("List-Unsubscribe-Post", "List-Unsubscribe=One-Click"))
    return headers


def _sender(value: str) -> str | None:
    if has_control(value):
        return "must be one line"
    # The email package is loaded only for a notifier.toml that defines an smtp channel.
    import email.utils  # noqa: PLC0415

    try:
        smtp_address(email.utils.parseaddr(value)[1])
    except ValueError as exc:
        return f'is not a usable e-mail address ({exc}); write "ops@example.com"'
    return None


def host_problem(value: str) -> str | None:
    """Why `value` cannot be the relay's host name or address; it is never quoted back: a
    host written as a URL with a login (`smtp://alice:PW@relay`) holds a password."""
    if has_control(value):
        return "must be one line"
    if any(ch.isspace() or ch == "," for ch in value):
        # Two relays listed, or a name mistyped: no relay is reached by it.
        return "must be one host name or address, without spaces or commas"
    if "@" in value or "/" in value:
        return (
            "must be the relay's host name or address alone (no `scheme://`, no `user:password@`); "
            "its port goes in `port`, a login in `username_env` and `password_env`"
        )
    return None


def _combined(definition: Any) -> list[str]:
    problems = []
    if definition.get("ssl") and definition.get("starttls"):
        problems.append(
            "`ssl` (implicit TLS, usually port 465) and `starttls` (upgrade, usually port "
            "587) exclude each other; set only one of them to true"
        )
    if ("username_env" in definition) != ("password_env" in definition):
        problems.append("set both `username_env` and `password_env`, or neither")
    return problems


SCHEMA = o.Schema(
    {
        "host": o.Option("str", required=True, check=host_problem, shown=o.hidden),
        "port": o.Option("int", check=o.port),
        "sender": o.Option("str", required=True, check=_sender),
        "starttls": o.Option("bool", default=False),
        "ssl": o.Option("bool", default=False),
        "username_env": o.env_name("username_env", "SMTP_USER"),
        "password_env": o.env_name("password_env", "SMTP_PASSWORD"),
        "timeout": o.Option("number", default=DEFAULT_TIMEOUT_S, check=o.seconds),
        # Connections to the relay at once, one per sender; unset: the run's --concurrency.
        "max_connections": o.Option("int", check=o.positive),
        # Refuse a batch file with a row that has neither unsubscribe_url nor _mailto.
        "require_unsubscribe": o.Option("bool", default=False),
        # A permanent rejection of a recipient (550/551/553 with 5.1.x at RCPT) puts the
        # address on the suppression list, with the relay's reply as the reason.
        "suppress_on_reject": o.Option("bool", default=True),
        "rate": o.RATE,
        "window": o.WINDOW,
        "domain_rates": o.DOMAIN_RATES,
    },
    _combined,
)


def has_control(value: str) -> bool:
    """Any C0/C1 control (CR, LF, NUL, TAB, NEL, ...) or a Unicode line/paragraph separator."""
    return control_character(value) is not None


def target_problem(target: str, channel: str) -> str | None:
    """Why a batch row's `to` cannot go through this smtp channel, as planning reports it."""
    why = recipient_problem(target)
    if why is None and _EMAIL.match(target):
        return None
    why = why or "expected local@domain"
    return f"`to` {target!r} is not an e-mail address, which channel {channel!r} needs ({why})"


def recipient_problem(target: str) -> str | None:
    """Why `target` cannot be an envelope recipient, by the very rules `send` applies; None
    when it can. Planning uses it so a bad address fails the file, not the run midway."""
    if has_control(target):
        return "contains a control character"
    try:
        smtp_address(target)
    except ValueError as exc:
        return str(exc)
    return None


def smtp_address(address: str) -> tuple[str, bool]:
    """A bare `local@domain` as it goes on the wire: an internationalised domain as
    punycode; True when the local part itself is non-ASCII (SMTPUTF8 needed)."""
    value = address.strip()
    local, at, domain = value.rpartition("@")
    if not at or not local or not domain:
        raise ValueError("expected local@domain")
    if _ADDRESS_FORBIDDEN.search(value) or "@" in local or has_control(value):
        raise ValueError("spaces, quotes, brackets, commas or semicolons are not allowed")
    if "=?" in value:
        # The `To:` header is parsed, and an RFC 2047 encoded word decoded: the header would
        # name another address than the envelope, or (decoded to a line break) none at all.
        raise ValueError("`=?` (an encoded word a mail reader would decode) is not allowed")
    if not domain.isascii():
        try:
            wire = domain.encode("idna").decode("ascii")
            back = wire.encode("ascii").decode("idna")
        except UnicodeError as exc:
            raise ValueError("the domain is not a valid internationalised name") from exc
        if back.casefold() != domain.casefold():
            # Encoding drops some characters (a zero-width space, a soft hyphen) and maps
            # others (fullwidth letters): the relay would get another address than the one
            # the suppression list and the row's identity know.
            raise ValueError(
                f"the domain goes on the wire as {wire!r}: characters in it would be dropped or "
                "changed; write it as it is sent"
            )
        registered = registered_spelling(domain)
        if registered != wire.lower():
            # ß, final sigma and the joiners: IDNA 2003 (this encoding) maps them to another
            # domain (strasse.de) than the one IDNA 2008 registers (xn--strae-oqa.de).
            raise ValueError(
                f"the domain would go on the wire as {wire!r}, another domain than "
                f"{registered!r}, which the two IDNA standards make of it; write the one meant"
            )
        domain = wire
    if misdotted(domain):
        raise ValueError("the domain is malformed")
    wire = f"{local}@{domain}"
    # smtplib puts every envelope address through email.utils.parseaddr (quoteaddr), which
    # reads `x:ann@example.com` as a group and `ann@example.com:x` as a trailing word: the
    # relay would get `<ann@example.com>`, an address the row and the suppression list know
    # by another spelling.
    import email.utils  # noqa: PLC0415 (loaded only when an smtp address is checked)

    if email.utils.parseaddr(wire)[1] != wire:
        raise ValueError(
            "the relay would be given another address than this one (a `:` reads as a "
            "group name); write the bare address"
        )
    return wire, not local.isascii()


# What the channel reads from a definition when it is built (beyond the schema, which has
# already checked it), and the forms its login secret could take in a server's reply.


def flag(where: str, definition: dict[str, Any], key: str) -> bool:
    value = definition.get(key, False)
    if not isinstance(value, bool):
        raise ChannelConfigError(f"{where}: `{key}` must be true or false, not {value!r}.")
    return value


def credential_names(where: str, definition: dict[str, Any]) -> tuple[str | None, str | None]:
    names: list[str | None] = []
    for key in ("username_env", "password_env"):
        value = definition.get(key)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise ChannelConfigError(
                f"{where}: `{key}` must be the NAME of an environment variable, e.g. "
                f'{key} = "SMTP_{key.split("_")[0].upper()}".'
            )
        names.append(value.strip() if isinstance(value, str) else None)
    username_env, password_env = names
    if (username_env is None) != (password_env is None):
        raise ChannelConfigError(
            f"{where}: set both `username_env` and `password_env` (the names of the "
            "environment variables holding the login), or neither."
        )
    return username_env, password_env


def read_env(where: str, variable: str, key: str) -> str:
    value = os.environ.get(variable)
    if not value:
        raise ChannelConfigError(
            f"{where}: environment variable {variable} (named by `{key}`) is not set or empty; "
            f"export {variable} before running notifier."
        )
    return value


def is_loopback(host: str) -> bool:
    if host.lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def secret_forms(username: str | None, password: str | None) -> tuple[str, ...]:
    """The password as it could appear in an echoed reply: raw, base64 (LOGIN), and the
    base64 of the PLAIN initial response."""
    if not password:
        return ()
    forms = [password, base64.b64encode(password.encode("utf-8")).decode("ascii")]
    if username:
        plain = f"\0{username}\0{password}".encode()
        forms.append(base64.b64encode(plain).decode("ascii"))
    return tuple(sorted(forms, key=len, reverse=True))
