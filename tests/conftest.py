"""Shared fixtures: one real broker (Tansu) per test session, a fresh topic prefix and data dir per test."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from litstream.infra.broker import EmbeddedBroker
from litstream.infra.kafka import create_topics
from litstream.infra.settings import Settings
from litstream.infra.stack import Stack

os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    log = tmp_path_factory.mktemp("broker") / "broker.log"
    with EmbeddedBroker(log_path=log) as b:
        yield b


@pytest.fixture
def settings(broker: EmbeddedBroker, tmp_path: Path) -> Settings:
    """Settings isolated to this test: own topics (prefix), own data dir and chDB directory."""
    s = Settings(bootstrap_servers=broker.bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:10]}", partitions=2,
                 data_dir=tmp_path / "data", clickhouse_dsn=f"chdb://{tmp_path / 'chdb'}")
    create_topics(s)
    return s


@pytest.fixture
def pipeline(settings: Settings) -> Iterator[Settings]:
    """The lifecycle processor and the span sink running as processes, on this test's topics."""
    with Stack(settings) as s:
        s.start("lifecycle", "process", "lifecycle")
        s.start("span-sink", "process", "span-sink")
        s.wait_ready("lifecycle", "lifecycle")
        s.wait_ready("span-sink", "span-sink", key="inserted")
        yield settings
