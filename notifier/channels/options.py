"""Channel option schemas: each channel module declares its settings in one table (key, type,
required, default, extra check); config loading and channel construction both validate a
definition against that one table.

A definition that passes is usable as written: a typo, a port out of range, `timeout =
"ten"` or `url = "http://"` is refused when the configuration loads, before any run is
stored, instead of turning every item of a stored run into `unknown`.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_plus, urlsplit

from notifier.domain.suppression import domain_key, domain_problem
from notifier.domain.text import control_character
from notifier.domain.windows import parse_window

Check = Callable[[Any], str | None]  # a problem with the value, or None when it is fine
# How a refused value is quoted back in the problem's sentence; None: it is not quoted.
Shown = Callable[[Any], str | None]


def hidden(value: Any) -> str | None:
    """A value never quoted back: it may be a secret written where its variable's name goes."""
    return None


@dataclass(frozen=True)
class Option:
    kind: str  # "str" | "bool" | "int" | "number" | "list[str]" | "table"
    required: bool = False
    default: Any = None
    check: Check | None = None
    shown: Shown = repr


def nearest(word: str, choices: Mapping[str, Any] | set[str]) -> str:
    """' (did you mean `x`?)' for the closest valid name, or ''."""
    match = difflib.get_close_matches(word, sorted(choices), n=1, cutoff=0.6)
    return f" (did you mean `{match[0]}`?)" if match else ""


def validate(where: str, definition: Mapping[str, Any], options: Mapping[str, Option]) -> list[str]:
    """Every problem of `definition` against `options`, as sentences naming the key and fix."""
    problems: list[str] = []
    for key in definition:
        if key != "type" and key not in options:
            hint = nearest(key, options)
            if not hint and any(w in key for w in ("secret", "password", "token")):
                hint = " (secrets come only from environment variables: name one with *_env)"
            problems.append(
                f"{where}: unknown setting `{key}`{hint}; allowed: {', '.join(sorted(options))}"
            )
    for key, option in options.items():
        if key not in definition:
            if option.required:
                problems.append(f"{where}: missing `{key}`: add it to the section")
            continue
        value = definition[key]
        problem = _type_problem(option.kind, value)
        if problem is None and option.check is not None:
            problem = option.check(value)
        if problem is not None:
            shown = option.shown(value)
            problems.append(f"{where}: `{key}` {problem}" + (f", not {shown}" if shown else ""))
    return problems


@dataclass(frozen=True)
class Schema:
    """A channel type's options, plus the checks that span several of them."""

    options: Mapping[str, Option]
    combined: Callable[[Mapping[str, Any]], list[str]] = lambda definition: []

    def problems(self, where: str, definition: Mapping[str, Any]) -> list[str]:
        found = validate(where, definition, self.options)
        return found or [f"{where}: {p}" for p in self.combined(definition)]

    def value(self, definition: Mapping[str, Any], key: str) -> Any:
        return definition.get(key, self.options[key].default)


def finite(value: float) -> bool:
    """Whether a TOML number is finite: tomllib reads an integer of any length, and
    math.isfinite raises OverflowError for one past a float's range instead of saying no."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _type_problem(kind: str, value: Any) -> str | None:
    if kind == "bool":
        return None if isinstance(value, bool) else "must be true or false"
    if isinstance(value, bool):  # TOML true is not a number or a string
        return f"must be a {'number' if kind in ('int', 'number') else 'string'}"
    if kind == "str":
        return None if isinstance(value, str) and value.strip() else "must be a non-empty string"
    if kind == "int":
        return None if isinstance(value, int) else "must be a whole number"
    if kind == "number":
        # `inf` and `nan` are TOML floats, but no timeout, delay or rate works with them.
        if not isinstance(value, int | float):
            return "must be a number"
        return None if finite(value) else "must be a finite number"
    if kind == "table":
        return None  # its check says what it must hold
    if kind == "list[str]":
        if isinstance(value, list) and all(isinstance(v, str) and v.strip() for v in value):
            return None
        return "must be a list of strings"
    raise AssertionError(f"unknown option kind {kind!r}")


def positive(value: Any) -> str | None:
    return None if value > 0 else "must be greater than 0"


# The longest timeout or delay a channel may set: past it, the moment a request's window
# closes (`timeout + query_delay` after it left) is no time worth waiting for.
MAX_SECONDS = 86400.0


def seconds(value: Any) -> str | None:
    """A timeout: more than 0, at most a day."""
    return (
        None
        if 0 < value <= MAX_SECONDS
        else f"must be more than 0 and at most {MAX_SECONDS:g} seconds"
    )


def delay(value: Any) -> str | None:
    """A delay that may be none: 0 to a day."""
    return None if 0 <= value <= MAX_SECONDS else f"must be from 0 to {MAX_SECONDS:g} seconds"


# The slowest rate (sends per second) a channel, a domain or `--rate` may set: one send a
# day. A slower one (1e-12) is a wait of millennia between two sends, past any date.
MIN_RATE = 1 / 86400


def rate_problem(value: Any) -> str | None:
    """A rate of sends per second: finite, and at least one send a day."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not finite(value):
        return "must be a finite number of sends per second"
    if value <= 0:
        return "must be greater than 0"
    if value < MIN_RATE:
        return f"must be at least {MIN_RATE:.3g} sends per second (one a day)"
    return None


def port(value: Any) -> str | None:
    return None if 0 < value < 65536 else "must be a port number from 1 to 65535"


def url_control(value: str) -> str | None:
    """The problem of a URL holding a control character (domain/text.py), naming the
    character, else None. No request line carries one: httpx refuses such a URL at every
    attempt, and urllib drops a tab or line break without a word."""
    found = control_character(value)
    return None if found is None else f"holds the control character {found}: remove it"


def http_url(value: Any) -> str | None:
    """An http(s) URL with a host: `http://` alone would make every send fail uncertainly."""
    control = url_control(value)
    if control is not None:
        return control
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError as exc:
        # urllib's reason may quote the whole netloc, user part and password included.
        return f"must be an http:// or https:// URL{'' if '@' in value else f' ({exc})'}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an http:// or https:// URL with a host, e.g. http://127.0.0.1:8025/hook"
    try:
        parts.hostname.encode("idna")
    except UnicodeError:
        return f"has a malformed host name {parts.hostname!r}"
    return None


# An environment variable's name, as POSIX shells accept it for `export NAME=…`.
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def env_name(key: str, example: str, value_prefix: str | None = None) -> Option:
    """A setting that names the environment variable holding a secret (`secret_env`,
    `password_env`, `urls_env`, ...). What is written there is never quoted back, nor kept
    when it is no name: an operator who wrote the secret itself there would find it in
    their terminal, their logs and the run's channel snapshot. `value_prefix` is how the
    secret itself starts (Standard Webhooks: `whsec_`), which no name of it does."""
    fix = (
        f"put the value in an environment variable (export {example}=…) and write its name "
        f'here, e.g. {key} = "{example}"; the value written is not shown'
    )

    def check(value: Any) -> str | None:
        if value_prefix is not None and value.startswith(value_prefix):
            return (
                f"holds a secret (it starts with {value_prefix}), not the NAME of the "
                f"environment variable holding it: {fix}"
            )
        if not _ENV_NAME.fullmatch(value):
            return (
                "must be the NAME of an environment variable (letters, digits and _, not "
                f"starting with a digit), not the value it holds: {fix}"
            )
        return None

    return Option("str", check=check, shown=hidden)


# Query parameters that carry a credential: one of its words (split at anything not a
# letter or digit) holding one of these...
_SECRET_WORD_PARTS = ("token", "secret", "passw", "credential", "apikey", "signature")
# ...or being one of these (whole words: `api_key` is one, `keyword` and `bypass` are not)...
_SECRET_WORDS = {"key", "pass", "pwd", "sig", "auth", "authorization", "jwt", "hmac",
                 "session", "sid", "otp", "ticket", "bearer", "cookie"}  # fmt: skip
# ...or the whole name being one of these (Azure Functions' key: `?code=`, not `?zip_code=`).
_SECRET_NAMES = {"code"}


def url_credential(value: str) -> str | None:
    """Where an http(s) URL carries a credential, said without quoting it: a user part
    (`user:password@`, sent as a login; a bare `token@` is one too), or a query parameter
    named like a credential (`token`, `api_key`, `secret`, `password`, `sig`, `auth`...).
    None when it shows none (a token in the path cannot be told from a path)."""
    try:
        parts = urlsplit(value)
    except ValueError:
        return "in its user part (user:password@)" if "@" in value else None
    if "@" in parts.netloc:
        return "in its user part (user:password@, sent as a login)"
    # Parameters hide in the query, the fragment and path segments (`/hook;token=…`).
    params = [parts.query, parts.fragment]
    params += [segment.partition(";")[2] for segment in parts.path.split("/")]
    return next((where for where in map(query_credential, params) if where), None)


def query_credential(query: str) -> str | None:
    """Where a URL's query carries a credential: a parameter named like one (`token`,
    `api_key`, `sig`, Azure Functions' `code`, and Apprise's header parameters such as
    `+Authorization` or `-X-Api-Key`), said without quoting its value. None when none is."""
    for field in re.split(r"[&;]", query):
        name, equals, _ = field.partition("=")
        plain = unquote_plus(name).lower()
        words = re.split(r"[^a-z0-9]+", plain)
        if (
            any(part in word for word in words for part in _SECRET_WORD_PARTS)
            or any(word in _SECRET_WORDS for word in words)
            or plain.strip("+-:") in _SECRET_NAMES
        ):
            return f"in its query parameter `{name}`" if equals else "in its query"
    return None


def shown_url(value: Any) -> str | None:
    """A URL as a problem quotes it: not at all when it may carry a credential."""
    return None if isinstance(value, str) and url_credential(value) else repr(value)


# Every channel type takes `rate`: most sends per second, one token bucket shared by all the
# channel's senders (the runner reads it; `--rate` overrides it for a run).
RATE = Option("number", check=rate_problem)


def _window(value: Any) -> str | None:
    try:
        parse_window(value)
    except ValueError as exc:
        return f"is not a send window: {exc}"
    return None


def _domain_rates(value: Any) -> str | None:
    if not isinstance(value, dict) or not value:
        return 'must be a table of domain = sends per second, e.g. "gmail.com" = 5'
    seen: dict[str, str] = {}
    for domain, rate in value.items():
        if not isinstance(domain, str) or "@" in domain or not domain.strip():
            return f"has {domain!r}, which is not a domain name like gmail.com"
        # A key no recipient's domain can be would be a rate that never applies.
        if (problem := domain_problem(domain)) is not None:
            return f"has {domain!r}, which {problem}"
        key = domain_key(domain)
        if key in seen:
            return (
                f"has {seen[key]!r} and {domain!r}, which name one domain ({key}): keep "
                "one of them, with the rate meant"
            )
        seen[key] = domain
        if rate_problem(rate) is not None:
            return f"gives {domain!r} the rate {rate!r}: it {rate_problem(rate)}"
    return None


# Every channel type also takes `window` (when its items may be sent; domain/windows.py) and
# `domain_rates` (sends per second per recipient domain; domain_rates.py).
WINDOW = Option("str", check=_window)
DOMAIN_RATES = Option("table", check=_domain_rates)
