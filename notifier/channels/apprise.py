"""Any of Apprise's services (Slack, Telegram, ntfy, JSON endpoints, ...) as one channel.

Apprise is an optional extra (`pip install 'notifier[apprise]'`): it is imported only when
such a channel is built. Apprise answers a notification with a bare success/failure, so this
channel is neither idempotent nor queryable, and any reported failure is UNCERTAIN (the
service may have received the message before something went wrong).

URLs come from `urls` (a list in notifier.toml, which is snapshotted into the database, so
it must hold no secret) and/or `urls_env` (the name of an environment variable holding URLs
separated by whitespace or commas, for URLs that embed tokens). A URL may contain `{to}`,
replaced by the URL-quoted target of each intent, so one channel can route per row. No URL
from `urls_env` is ever echoed; one from `urls` only with its secret-looking parts masked.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from notifier.channels import options as o
from notifier.channels.base import Capabilities, ChannelConfigError, Ready, always, go_ahead
from notifier.domain.answers import ChannelError, ErrorKind, Receipt
from notifier.domain.intent import Intent

if TYPE_CHECKING:
    from apprise import Apprise, NotifyBase

PLACEHOLDER = "{to}"
# What Apprise reads as a list in a URL's target: one row is one recipient.
_LIST_SEPARATORS = re.compile(r"[,;\s]")
# A recipient address Apprise's e-mail plugins read whole, as the row writes it: dot-separated
# atoms of letters, digits, `_` and `-`, an optional `+tag` after them, 64 characters at most
# (RFC 5321's longest local part); then a host name of at most 11 labels of at most 63
# characters, its top-level label letters. Apprise reads more loosely (utils/parse.py:
# GET_EMAIL_RE, EMAIL_DETECTION_RE): what it drops or cuts off (past a domain's eleventh label
# or a label's 63rd letter included) leaves another address.
_ATOM = r"[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9])?"
_BARE_EMAIL = re.compile(
    rf"(?=[^@]{{1,64}}@){_ATOM}(?:\+{_ATOM})?@(?:{_LABEL}\.){{1,10}}[A-Za-z]{{2,63}}"
)
_MAX_EMAIL_CHARS = 254  # RFC 5321's longest path
# Apprise's own socket timeouts where the channel sets none: 4 s to connect and 4 s per read
# (its URL arguments `cto` and `rto`).
APPRISE_TIMEOUTS_S = 8.0
# Targets tried when validating a URL that contains {to}: plugins check the shape of their
# targets (an address, a phone number, a channel name), so one of these should fit.
_PROBE_TARGETS = ("notifier-probe@example.com", "15555550100", "notifier-probe")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]{0,31})://")
_SCHEME_AHEAD = re.compile(r",+(?=[A-Za-z][A-Za-z0-9+.-]{0,31}://)")
_HOSTNAME = re.compile(r"^(localhost|[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+|\[[0-9A-Fa-f:.]+\])$")


def target_problem(target: str, channel: str) -> str | None:
    """Why a batch row's `to` cannot go through this apprise channel, as planning reports
    it: Apprise splits a URL's target at commas, semicolons and spaces, so a `to` holding
    them would reach every recipient listed in it, past the suppression list, which knows
    the row's `to` as one address. And an e-mail address (an `@` after something) must be a
    bare one Apprise reads whole (`_BARE_EMAIL`): its e-mail plugins read `<ann@x.com>`,
    `"ann@x.com"`, `mailto:ann@x.com` and `ann@x.com.` as ann@x.com, an apostrophe as the end
    of a name (`o'brien@x.com` goes to brien@x.com) and a top-level domain only as far as
    its letters go (`ann@x.xn--p1ai` goes to ann@x.xn): another address than the one the
    suppression list knows the row by."""
    value = target.strip()
    if _LIST_SEPARATORS.search(value):
        return (
            f"`to` {target!r} holds a list (a comma, semicolon or space), which channel "
            f"{channel!r} would send to each of: give one recipient per row"
        )
    if "@" in value[1:] and (len(value) > _MAX_EMAIL_CHARS or not _BARE_EMAIL.fullmatch(value)):
        return (
            f"`to` {target!r} is not a bare e-mail address, and Apprise (channel {channel!r}) "
            "would read another address out of it (brackets, quotes, `mailto:`, an apostrophe "
            "or a trailing dot are no part of an address to it): write the address alone, "
            "its local part of letters, digits and . _ - (and one +tag), its domain a host "
            "name whose last label is letters"
        )
    return None


def _urls_given(definition: Any) -> list[str]:
    if definition.get("urls") or definition.get("urls_env"):
        return []
    return ["set `urls` (a list of Apprise URLs) or `urls_env` (a variable name)"]


def _urls_problem(value: Any) -> str | None:
    """The schema's check of `urls`, when notifier.toml loads (before a run is planned, and
    so before the channel's definition is copied into the run's database): no entry may
    embed a credential. Said without quoting the entry."""
    for index, url in enumerate(value, 1):
        if _embeds_secret(url.strip()):
            return (
                f"entry {index} ({mask_url(url.strip())}) embeds a password or token, and "
                "notifier.toml is copied into the run's database; put the URL in an "
                "environment variable and name that variable with `urls_env` instead"
            )
    return None


SCHEMA = o.Schema(
    {
        "urls": o.Option("list[str]", check=_urls_problem, shown=o.hidden),
        "urls_env": o.env_name("urls_env", "ALERT_URLS"),
        "timeout": o.Option("number", check=o.seconds),
        "rate": o.RATE,
        "window": o.WINDOW,
        "domain_rates": o.DOMAIN_RATES,
    },
    _urls_given,
)
# Apprise has no idempotency keys, nor any way to ask a service what it received; thread-safe
# because every send builds its own Apprise object and plugin instances.
CAPABILITIES = Capabilities(idempotent=False, queryable=False, thread_safe=True)


def capabilities(definition: Mapping[str, Any]) -> Capabilities:
    return CAPABILITIES


@dataclass(frozen=True)
class _Url:
    template: str  # the URL, possibly with {to}
    label: str  # how messages may name it: masked, never the whole secret


class AppriseChannel:
    """Sends `subject` as the Apprise title and `body` as plain text to every URL."""

    def __init__(self, name: str, definition: dict[str, Any]) -> None:
        self.name = name
        self.idempotent, self.queryable, self.thread_safe = CAPABILITIES
        where = f"channel {name!r} (apprise)"
        problems = SCHEMA.problems(where, definition)
        if problems:
            raise ChannelConfigError("; ".join(problems))
        try:
            # The one import of the optional extra, so that notifier runs without it.
            import apprise  # noqa: PLC0415 - a top-level import would make the extra mandatory
        except ImportError as exc:
            raise ChannelConfigError(
                f"{where}: the Apprise library is not installed; "
                "run: pip install 'notifier[apprise]'"
            ) from exc
        _quiet_apprise_logging()

        self._urls = _definition_urls(where, definition) + _env_urls(where, definition)
        if not self._urls:
            raise ChannelConfigError(
                f"{where}: set `urls` (a list of Apprise URLs) or `urls_env` (the name of an "
                "environment variable holding them)."
            )
        timeout = definition.get("timeout")
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0
        ):
            raise ChannelConfigError(f"{where}: `timeout` must be a positive number of seconds.")
        self.timeout: float | None = None if timeout is None else float(timeout)
        # How long after a notification left its service may still take it (evidence.Caps):
        # a not-sent mark waits that long (api/settling.py). Unset, Apprise's own connect and
        # read timeouts apply.
        # The URLs are notified one after the other, each connecting and reading within
        # its timeouts (`timeout` for each, else Apprise's own 4 s + 4 s): the last one's
        # request may leave only once the others ended, and its service may commit it
        # until its own timeouts after that.
        per_url = 2 * self.timeout if self.timeout is not None else APPRISE_TIMEOUTS_S
        self.timeout_s = len(self._urls) * per_url
        self.query_delay_s = 0.0  # a service behind Apprise cannot be asked
        self.suppress_on_reject = False  # no relay to reject a recipient
        self.max_in_flight: int | None = None  # as many as the run's senders
        self._apprise: type[Apprise] = apprise.Apprise
        self._text_format = apprise.NotifyFormat.TEXT
        # Never follow a 3xx: it proves nothing about the notification (a 302 or 303 turns
        # the POST into a GET of its Location, whose 200 Apprise would report as success), and
        # a request sent on to the Location carries the URL's headers (`+X-Api-Key=`) to a
        # host the URL does not name. Not followed, it is a failure: maybe delivered.
        self._asset = apprise.AppriseAsset(http_redirects=False)
        for url in self._urls:
            probes = _PROBE_TARGETS if PLACEHOLDER in url.template else _PROBE_TARGETS[:1]
            if not any(self._plugin(url, probe) is not None for probe in probes):
                raise ChannelConfigError(
                    f"{where}: Apprise cannot use {url.label}; check its syntax for that "
                    "service (see https://github.com/caronc/apprise/wiki)."
                )

    def send(self, intent: Intent, ready: Ready = always) -> Receipt:
        if not intent.subject and not intent.body:
            raise ChannelError(
                ErrorKind.PERMANENT,
                f"apprise channel {self.name!r}: the notification has neither subject nor body",
            )
        plugins = []
        for url in self._urls:
            plugin = self._plugin(url, intent.target)
            if plugin is None:
                raise ChannelError(
                    ErrorKind.PERMANENT,
                    f"apprise channel {self.name!r}: {url.label} is not a usable Apprise URL "
                    "once {to} is replaced by this row's target; nothing was sent",
                )
            plugins.append((url, plugin))
        # Asked once, before the first URL: once one has it, the others must be tried too
        # (a partial delivery stays known as one). Apprise's plugins make their own
        # connections, so this is as late as the check can be.
        go_ahead(ready)
        # One notify per URL, so that a partial delivery is known as such: an operator who
        # marked it "not sent" would send it again to the URLs that got it.
        delivered: list[str] = []
        failed: list[str] = []
        raised: str | None = None
        for url, plugin in plugins:
            notifier = self._apprise(asset=self._asset)
            notifier.add(plugin)
            try:
                ok = bool(
                    notifier.notify(
                        body=intent.body, title=intent.subject, body_format=self._text_format
                    )
                )
            except Exception as exc:
                # Never echo the exception: a plugin's message may quote the URL, token included.
                raised, ok = type(exc).__name__, False
            (delivered if ok else failed).append(url.label)
        if delivered and failed:
            raise ChannelError(
                ErrorKind.PARTIAL,
                f"apprise channel {self.name!r}: partial delivery: delivered to "
                f"{', '.join(delivered)}; failed for {', '.join(failed)} (which may or may not "
                "have received it)",
            )
        if raised is not None:
            raise ChannelError(
                ErrorKind.UNCERTAIN,
                f"apprise channel {self.name!r}: Apprise raised {raised} while "
                "sending; the service may have received the message",
            )
        if failed:
            raise ChannelError(
                ErrorKind.UNCERTAIN,
                f"apprise channel {self.name!r}: Apprise reported a failure for "
                f"{', '.join(failed)}; it cannot tell whether the service received the message",
            )
        return Receipt(receipt_id=f"apprise:{intent.idempotency_key}")

    def query(self, key: str) -> Receipt | None:
        raise ChannelError(
            ErrorKind.UNCERTAIN,
            f"apprise channel {self.name!r} cannot be queried: Apprise offers no way to ask "
            f"a service whether it received {key}",
        )

    def close(self) -> None:
        pass

    def _plugin(self, url: _Url, target: str) -> NotifyBase | None:
        """The Apprise plugin for `url` with `{to}` filled in, or None when Apprise cannot
        parse or load it."""
        resolved = url.template.replace(PLACEHOLDER, quote(target, safe=""))
        try:
            plugin = self._apprise.instantiate(resolved, asset=self._asset)
        except Exception:  # a plugin constructor that raises despite suppress_exceptions
            return None
        if plugin is not None and self.timeout is not None:
            plugin.socket_connect_timeout = self.timeout
            plugin.socket_read_timeout = self.timeout
        return plugin


# ---------------------------------------------------------------------- definitions


def _definition_urls(where: str, definition: dict[str, Any]) -> list[_Url]:
    raw = definition.get("urls")
    if raw is None:
        return []
    if not isinstance(raw, list) or not all(isinstance(u, str) and u.strip() for u in raw):
        raise ChannelConfigError(
            f'{where}: `urls` must be a list of Apprise URL strings, e.g. urls = ["json://'
            'hooks.example.com/notify?-to={to}"].'
        )
    urls = []
    for value in raw:
        url = value.strip()
        label = f"URL {mask_url(url)}"
        if _embeds_secret(url):
            raise ChannelConfigError(
                f"{where}: {label} embeds a password or token, and notifier.toml is copied "
                "into the run's database; put the URL in an environment variable and name "
                "that variable with `urls_env` instead."
            )
        urls.append(_Url(url, label))
    return urls


def _env_urls(where: str, definition: dict[str, Any]) -> list[_Url]:
    variable = definition.get("urls_env")
    if variable is None:
        return []
    if not isinstance(variable, str) or not variable.strip():
        raise ChannelConfigError(
            f"{where}: `urls_env` must be the NAME of an environment variable, e.g. urls_env = "
            '"APPRISE_URLS".'
        )
    variable = variable.strip()
    value = os.environ.get(variable, "")
    urls = split_urls(value)
    if not urls:
        raise ChannelConfigError(
            f"{where}: environment variable {variable} (named by `urls_env`) is not set or "
            f"empty; export {variable} with the Apprise URL(s), separated by spaces or commas."
        )
    result = []
    for index, url in enumerate(urls, 1):
        scheme = _SCHEME.match(url)
        shown = f"{scheme.group(1)}://…" if scheme else "no scheme://"
        result.append(_Url(url, f"entry {index} of ${variable} ({shown})"))
    return result


def split_urls(value: str) -> list[str]:
    """URLs separated by whitespace or commas. A comma splits only where a new `scheme://`
    follows, since some Apprise URLs use commas inside (lists of targets)."""
    urls = []
    for chunk in value.split():
        for piece in _SCHEME_AHEAD.split(chunk):
            url = piece.strip(",")
            if url:
                urls.append(url)
    return urls


def mask_url(url: str) -> str:
    """`url` safe to print: scheme, host and port when they look like a host name and a
    port; credentials, path and query (where services keep their tokens) replaced."""
    match = _SCHEME.match(url)
    if not match:
        return "(not a URL: scheme:// missing)"
    rest = url[match.end() :]
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    netloc, tail = rest[:cut], rest[cut:]
    userinfo, at, hostport = netloc.rpartition("@")
    shown = "***@" if at and userinfo else ""
    host, colon, port = hostport, "", ""
    if not hostport.endswith("]") and ":" in hostport:
        host, colon, port = hostport.rpartition(":")
    if _HOSTNAME.match(host) and (not colon or port.isdigit()):
        shown += host + colon + port
    else:
        shown += "***"
    return f"{match.group(1)}://{shown}{'/…' if tail.strip('/') else ''}"


def _embeds_secret(url: str) -> bool:
    """What a webhook's URL is refused for (options.url_credential: a user part, `user:pw@`
    or a token alone such as ntfy's `tk_…@`; a parameter named like a credential, Apprise's
    header parameters `+Authorization=` included), or a `name:token` where a host and port
    go (`tgram://BOT_ID:TOKEN/…`). A token in the path (`discord://ID/TOKEN`) cannot be told
    from a path: `urls_env` is for those."""
    if o.url_credential(url) is not None:
        return True
    match = _SCHEME.match(url)
    hostport = re.split(r"[/?#]", url[match.end() :] if match else url, maxsplit=1)[0]
    _, colon, port = hostport.rpartition(":")
    return bool(colon) and not hostport.endswith("]") and not port.isdigit()


def _quiet_apprise_logging() -> None:
    """Apprise logs every failed delivery at WARNING; this channel reports those itself.
    Quieten it unless the application configured the `apprise` logger explicitly."""
    logger = logging.getLogger("apprise")
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.ERROR)
