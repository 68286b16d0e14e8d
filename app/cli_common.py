"""What every ``litstream`` command shares: its consoles, its settings, its one-line failure, ClickHouse reads."""

from __future__ import annotations

import os
import sys
from typing import Any, NoReturn

from rich.console import Console
from rich.markup import escape

from litstream.infra.settings import Settings

console = Console()
err = Console(stderr=True, soft_wrap=True)  # an error is one line, however long


def load_settings() -> Settings:
    """Settings from the environment; without LITSTREAM_BOOTSTRAP_SERVERS, the stack `litstream up` runs here."""
    from .stack import running_stack

    settings = Settings()
    if "LITSTREAM_BOOTSTRAP_SERVERS" not in os.environ:
        info = running_stack(settings.data_dir)
        if info is not None:
            settings = settings.model_copy(update={
                "bootstrap_servers": info["bootstrap_servers"], "topic_prefix": info["topic_prefix"],
                "partitions": info["partitions"]})
    return settings


def fail(message: str, code: int = 1) -> NoReturn:
    """Exit with one line: code 1 when the environment is at fault (no broker, no stack), 2 for bad input."""
    err.print(f"[red]error:[/] {escape(message)}")
    sys.exit(code)


def ch_reader(settings: Settings, wait_s: float = 30.0) -> Any:
    """Read ClickHouse as a person: through the stack's span sink when a stack runs here (never opening chDB
    under it), else read-only on the directory, which must already hold data."""
    from litstream.infra import clickhouse

    from .stack import running_stack

    stack = running_stack(settings.data_dir)
    return clickhouse.reader(settings.resolved_clickhouse_dsn, may_open=stack is None, wait_s=wait_s,
                             limits=clickhouse.QueryLimits.from_settings(settings))
