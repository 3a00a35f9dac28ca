"""Where a test of several workers on one PostgreSQL run starts: a receiver on 127.0.0.1, a
fresh schema, and a workspace whose notifier.toml sends to that receiver."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

from ..receiver import Receiver, receiving, webhook_config
from .postgres import postgres_schema
from .workspace import Workspace


@contextmanager
def shared_run(
    tmp_path: Path, server: str, receiver: Receiver, **config: Any
) -> Iterator[Workspace]:
    """The workspace, `receiver` answering for the block; `config`: webhook_config's."""
    with (
        receiving(receiver),
        postgres_schema(server) as url,
        closing(Workspace(tmp_path, url)) as ws,
    ):
        (tmp_path / "notifier.toml").write_text(webhook_config(receiver, **config))
        yield ws
