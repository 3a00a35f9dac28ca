"""`notifier.toml`: channel definitions and retry settings.

Secrets never appear here, only the *names* of environment variables that hold them; a run
snapshots the definitions it uses, so `resume` talks to exactly the same targets.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from notifier.channels import definition_problems
from notifier.channels.options import finite, nearest
from notifier.domain import retry
from notifier.domain.chain import KEY_ENV, Signer, signer_from
from notifier.domain.errors import BadInput
from notifier.domain.text import control_character

DEFAULT_CHANNEL = "outbox"
DEFAULT_LEASE_TTL_S = 30.0
# The heartbeat renews the lease every ttl/3, and a worker sends only while it renewed it less
# than 2/3 of ttl ago: below this a renewal slowed by a busy disk or database lets the lease
# lapse, and every command then finds that another process took the run over.
MIN_LEASE_TTL_S = 2.0
# Every number of the file is finite and within its setting's range: `inf`, `nan` or 1e300
# seconds would pass as a number and overflow the first time a lease, a retry or a pause is
# timed, after the run was stored. A day is longer than any sensible lease or backoff.
DAY_S = 86400.0
MAX_LEASE_TTL_S = DAY_S
_RETRY_RANGES: dict[str, tuple[float, float]] = {
    "max_attempts": (1, 10_000),
    "deadline": (0, 30 * DAY_S),
    "backoff_base": (0, DAY_S),
    "backoff_max": (0, DAY_S),
    "down_after": (1, 10_000),
}

_RETRY_KEYS = {"max_attempts", "deadline", "backoff_base", "backoff_max", "down_after"}
_RETRY_WHOLE = {"max_attempts", "down_after"}  # counts
_LEASE_KEYS = {"ttl"}
_APPROVAL_KEYS = {"required"}
_AUDIT_KEYS = {"key_file"}
# A misspelled section (`[retyr]`) must not be silently ignored: its settings would not apply.
_SECTIONS = {"channels", "retry", "lease", "approval", "audit"}


class ConfigError(BadInput):
    """The configuration cannot be used as written; the message names the file and fix."""


@dataclass(frozen=True)
class RetrySettings:
    max_attempts: int = retry.DEFAULT_MAX_ATTEMPTS
    deadline_s: float = retry.DEFAULT_DEADLINE_S
    backoff_base_s: float = retry.DEFAULT_BACKOFF_BASE_S
    backoff_max_s: float = retry.DEFAULT_BACKOFF_MAX_S
    down_after: int = retry.DEFAULT_DOWN_AFTER

    def policy(self) -> retry.RetryPolicy:
        return retry.RetryPolicy.from_settings(
            self.max_attempts,
            self.deadline_s,
            self.backoff_base_s,
            self.backoff_max_s,
            self.down_after,
        )


@dataclass(frozen=True)
class Config:
    path: Path | None
    channels: dict[str, dict[str, Any]] = field(default_factory=dict)
    retry: RetrySettings = field(default_factory=RetrySettings)
    lease_ttl_s: float = DEFAULT_LEASE_TTL_S
    # The approval policy: every run needs one (`[approval] required = true`), or every run
    # sending through one of these channels (`[channels.NAME.approval] required = true`, or
    # `required = true` in [channels.NAME]).
    approval_for_all: bool = False
    approval_channels: frozenset[str] = frozenset()
    # `[audit] key_file`: the file holding the key that links every run's events
    # (chain.py), relative to this file; NOTIFIER_AUDIT_KEY in the environment wins.
    audit_key_file: Path | None = None

    def signer(self) -> Signer:
        """What links the events of the runs this process writes: the environment's key,
        else the key file's, else none (plain SHA-256 links)."""
        text = None
        if self.audit_key_file is not None and not os.environ.get(KEY_ENV):
            try:
                text = self.audit_key_file.read_text("utf-8")
            except UnicodeDecodeError:
                # Never the decoder's message: it quotes a byte of the key and its place.
                raise ConfigError(
                    f"{self.path}: [audit] key_file {self.audit_key_file} holds bytes that "
                    "are not UTF-8 text, so no key can be read from it. Put the key in it as "
                    f"text (e.g. hex or base64), or set {KEY_ENV}; nothing was changed."
                ) from None
            except OSError as exc:
                raise ConfigError(
                    f"{self.path}: [audit] key_file {self.audit_key_file} cannot be read "
                    f"({exc}). Fix the path or the file's permissions, or set {KEY_ENV}."
                ) from exc
            if not text.strip():
                raise ConfigError(
                    f"{self.path}: [audit] key_file {self.audit_key_file} is empty. Put the "
                    f"key in it, or set {KEY_ENV}."
                )
        env_key = os.environ.get(KEY_ENV)
        if env_key:
            try:
                env_key.encode("utf-8")
            except UnicodeEncodeError:
                # Bytes the environment held that are not UTF-8: never shown, they are a key.
                raise ConfigError(
                    f"{KEY_ENV} holds bytes that are not UTF-8 text, so no key can be read "
                    f"from it. Set {KEY_ENV} to the key as text (e.g. hex or base64); "
                    "nothing was changed."
                ) from None
        return signer_from(env_key, text)

    def approval_required(self, channels: Iterable[str]) -> bool:
        """Whether a run through `channels` must wait for `notifier approve` before it sends,
        whatever the command line says."""
        return self.approval_for_all or not self.approval_channels.isdisjoint(channels)

    def channel_types(self) -> dict[str, str]:
        return {name: str(d["type"]) for name, d in self.channels.items()}

    def snapshot(self, names: set[str]) -> dict[str, dict[str, Any]]:
        """The definitions `names` use, as stored in the run (they hold no secret values)."""
        return {name: dict(self.channels[name]) for name in sorted(names)}


def load(path: Path | None, *, explicit: bool) -> Config:
    """Read `path`; a missing file is an error only when the operator named it."""
    builtin: dict[str, dict[str, Any]] = {DEFAULT_CHANNEL: {"type": "outbox"}}
    if path is None or not path.exists():
        if explicit and path is not None:
            raise ConfigError(f"{path}: no such configuration file. Check --config.")
        return Config(path=None, channels=builtin)
    try:
        document = tomllib.loads(path.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the configuration: {exc}. Fix the file.") from exc
    for section in document:
        if section not in _SECTIONS:
            raise ConfigError(
                f"{path}: unknown section [{section}]{nearest(section, _SECTIONS)}; "
                f"notifier reads {', '.join(f'[{s}]' for s in sorted(_SECTIONS))}. Fix the file."
            )
    channels = dict(builtin)
    raw_channels = document.get("channels", {})
    if not isinstance(raw_channels, Mapping):
        raise ConfigError(f"{path}: `channels` must be a table of [channels.NAME] sections.")
    approval_channels = set()
    for name, definition in raw_channels.items():
        channels[name], required = _check_channel(path, name, definition)
        if required:
            approval_channels.add(name)
    return Config(
        path=path,
        channels=channels,
        retry=_retry_settings(path, document.get("retry", {})),
        lease_ttl_s=_lease_ttl(path, document.get("lease", {})),
        approval_for_all=_approval_required(f"{path}: [approval]", document.get("approval", {})),
        approval_channels=frozenset(approval_channels),
        audit_key_file=_audit_key_file(path, document.get("audit", {})),
    )


def _audit_key_file(path: Path, table: Any) -> Path | None:
    if not isinstance(table, Mapping):
        raise ConfigError(f'{path}: [audit] must be a table, e.g. `key_file = "audit.key"`.')
    unknown = sorted(set(table) - _AUDIT_KEYS)
    if unknown:
        raise ConfigError(
            f"{path}: [audit] unknown setting `{unknown[0]}`{nearest(unknown[0], _AUDIT_KEYS)} "
            "(allowed: key_file). Fix the file; nothing was stored."
        )
    name = table.get("key_file")
    if name is None:
        return None
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{path}: [audit] key_file must be the path of a file. Fix the file.")
    return path.parent / name


def _approval_required(where: str, table: Any) -> bool:
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where} must be a table, e.g. `required = true`.")
    unknown = sorted(set(table) - _APPROVAL_KEYS)
    if unknown:
        raise ConfigError(
            f"{where} unknown setting `{unknown[0]}`{nearest(unknown[0], _APPROVAL_KEYS)} "
            "(allowed: required). Fix the file; nothing was stored."
        )
    required = table.get("required", False)
    if not isinstance(required, bool):
        raise ConfigError(f"{where} required must be true or false. Fix the file.")
    return required


def _check_channel(path: Path, name: str, definition: Any) -> tuple[dict[str, Any], bool]:
    """The channel's definition, and whether runs through it need approval: the policy is
    not part of the definition (a run's snapshot holds how to reach the channel)."""
    where = f"{path}: [channels.{name}]"
    if not name.strip():
        raise ConfigError(
            f'{path}: a [channels."{name}"] section has an empty name, which no row can '
            "choose (an empty `channel` cell means the default channel). Give it a name; "
            "nothing was stored."
        )
    # A channel's name is stored with each item, listed and typed after `--channel`: no
    # control character, as in a row's `to` or `id` (PostgreSQL stores no NUL; an escape acts
    # on the terminal of whoever lists the run).
    if (control := control_character(name)) is not None:
        raise ConfigError(
            f"{path}: [channels.{name!r}]: a channel's name holds the control character "
            f"{control}. Rename the section (and the rows' `channel` "
            "cells that name it) without it; nothing was stored."
        )
    if "@" in name:
        # A channel's domain rates are buckets named CHANNEL@DOMAIN (rate_buckets): a
        # channel named so would share its bucket with another channel's domain.
        raise ConfigError(
            f"{where}: a channel's name may not hold `@`. Rename the section (and the rows' "
            "`channel` cells that name it); nothing was stored."
        )
    if not isinstance(definition, Mapping):
        raise ConfigError(f"{where} must be a table.")
    definition = dict(definition)
    required = _approval_required(f"{where}.approval", definition.pop("approval", {}))
    # `required = true` right in the channel's table says the same (the CLI contract's words).
    required |= _approval_required(where, {"required": definition.pop("required", False)})
    problems = definition_problems(where, definition)
    if problems:
        raise ConfigError("; ".join(problems) + ". Fix the section; nothing was stored.")
    return definition, required


def _lease_ttl(path: Path, table: Any) -> float:
    if not isinstance(table, Mapping):
        raise ConfigError(f"{path}: [lease] must be a table.")
    for key in table:
        if key not in _LEASE_KEYS:
            raise ConfigError(f"{path}: [lease] unknown setting `{key}`; allowed: ttl.")
    ttl = table.get("ttl", DEFAULT_LEASE_TTL_S)
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or ttl <= 0:
        raise ConfigError(f"{path}: [lease] ttl must be a positive number of seconds.")
    if not finite(ttl) or ttl > MAX_LEASE_TTL_S:
        raise _out_of_range(path, "lease", "ttl", ttl, (MIN_LEASE_TTL_S, MAX_LEASE_TTL_S))
    if ttl < MIN_LEASE_TTL_S:
        raise ConfigError(
            f"{path}: [lease] ttl = {ttl:g} is below the minimum of {MIN_LEASE_TTL_S:g} "
            f"seconds. The lease is renewed every ttl/3 and a worker sends only while it "
            "renewed it less than two thirds of ttl ago, so a shorter lease lapses between "
            "renewals and every command then says another process took over. Set `ttl` to "
            f"{MIN_LEASE_TTL_S:g} or more (default {DEFAULT_LEASE_TTL_S:g}) in [lease]; "
            "nothing was changed."
        )
    return float(ttl)


def _retry_settings(path: Path, table: Any) -> RetrySettings:
    if not isinstance(table, Mapping):
        raise ConfigError(f"{path}: [retry] must be a table.")
    unknown = sorted(set(table) - _RETRY_KEYS)
    if unknown:
        raise ConfigError(
            f"{path}: [retry] unknown setting `{unknown[0]}`{nearest(unknown[0], _RETRY_KEYS)} "
            f"(allowed: {', '.join(sorted(_RETRY_KEYS))})."
        )
    for key, bounds in _RETRY_RANGES.items():
        value = table.get(key)
        if value is None:
            continue
        # A TOML number as written: a quoted one ("3") or a bool is a mistake to name, not
        # a value to convert, and a count cut from 2.5 to 2 would not be what was meant.
        whole = key in _RETRY_WHOLE
        kind = "a whole number" if whole else "a number"
        if isinstance(value, bool) or not isinstance(value, int | float):
            shown = str(value).lower() if isinstance(value, bool) else repr(value)
            unquoted = ", written without quotes," if isinstance(value, str) else ""
            raise ConfigError(
                f"{path}: [retry] {key} must be {kind}{unquoted or ','} not {shown}. Fix `{key}` "
                "in [retry]; nothing was stored."
            )
        if not (finite(value) and bounds[0] <= value <= bounds[1]):
            raise _out_of_range(path, "retry", key, value, bounds)
        if whole and not float(value).is_integer():
            raise ConfigError(
                f"{path}: [retry] {key} must be {kind}, not {value!r}. Fix `{key}` in "
                "[retry]; nothing was stored."
            )
    defaults = RetrySettings()
    return RetrySettings(
        max_attempts=int(table.get("max_attempts", defaults.max_attempts)),
        deadline_s=float(table.get("deadline", defaults.deadline_s)),
        backoff_base_s=float(table.get("backoff_base", defaults.backoff_base_s)),
        backoff_max_s=float(table.get("backoff_max", defaults.backoff_max_s)),
        down_after=int(table.get("down_after", defaults.down_after)),
    )


def _out_of_range(
    path: Path, section: str, key: str, value: Any, bounds: tuple[float, float]
) -> ConfigError:
    return ConfigError(
        f"{path}: [{section}] {key} = {value!r} is out of range: it must be a finite number "
        f"from {bounds[0]:g} to {bounds[1]:g}. Set `{key}` within that range in "
        f"[{section}]; nothing was stored."
    )


def snapshot_drift(snapshot: Mapping[str, Mapping[str, Any]], current: Config) -> list[str]:
    """Human-readable differences between a run's stored channel definitions and the file,
    so a changed URL is reported rather than silently used."""
    notes = []
    for name, stored in snapshot.items():
        now = current.channels.get(name)
        if now is None:
            if current.path is not None and stored.get("type") != "outbox":
                notes.append(
                    f"channel {name!r} is no longer in {current.path}; using the run's copy"
                )
            continue
        for key in sorted(set(stored) | set(now)):
            if stored.get(key) != now.get(key):
                notes.append(
                    f"channel {name!r}: {key} is {now.get(key)!r} in {current.path} but this run "
                    f"was planned with {stored.get(key)!r}; the run keeps its planned value"
                )
    return notes
