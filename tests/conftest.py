"""Shared fixtures: one real Apache Kafka broker per test worker, a fresh topic prefix and data dir per test."""

from __future__ import annotations

import importlib.util
import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from litstream.app import roles
from litstream.app.stack import Stack
from litstream.infra.broker import KafkaBroker
from litstream.infra.kafka import create_topics
from litstream.infra.settings import Settings
from litstream.streams.span_sink import SpanSink

os.environ.setdefault("OMP_NUM_THREADS", "1")
# Group sessions of 3 s: a test that kills a worker sees its partitions move on sooner than with the default 10 s.
os.environ.setdefault("LITSTREAM_SESSION_TIMEOUT_MS", "3000")
# Stacks the tests start (`litstream up`, the demos) keep their log in a throwaway directory: every test starts
# empty. tests/test_durable_log.py runs the durable default.
os.environ.setdefault("LITSTREAM_BROKER_STORAGE", "ephemeral")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``@pytest.mark.slow`` tests run only with LITSTREAM_SLOW=1, when the environment variable named by the
    marker's ``enabled_by`` is set, or when the module named by its ``if_importable`` imports (the optional extra
    the test needs is installed). E.g. ``slow(enabled_by="LITSTREAM_VLLM_PYTHON", if_importable="vllm")``."""
    if os.environ.get("LITSTREAM_SLOW") == "1":
        return
    for item in items:
        marker = item.get_closest_marker("slow")
        if marker is None:
            continue
        enabled_by, module = marker.kwargs.get("enabled_by"), marker.kwargs.get("if_importable")
        if (enabled_by and os.environ.get(enabled_by)) or (module and importlib.util.find_spec(module)):
            continue
        opt_in = " or ".join(["LITSTREAM_SLOW=1", *([enabled_by] if enabled_by else []),
                              *([f"install {module}"] if module else [])])
        item.add_marker(pytest.mark.skip(reason=f"slow: needs {opt_in}"))


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """One broker per test worker (pytest-xdist runs a session per worker); tests that stop a broker start their
    own. Each test keeps to its own topics (a fresh prefix), so they share it safely."""
    root = tmp_path_factory.mktemp("broker")
    with KafkaBroker(root / "log", log_path=root / "broker.log") as b:
        yield b


@pytest.fixture
def settings(broker: KafkaBroker, tmp_path: Path) -> Settings:
    """Settings isolated to this test: own topics (prefix), own data dir and chDB directory."""
    s = Settings(bootstrap_servers=broker.bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:10]}", partitions=2,
                 data_dir=tmp_path / "data", clickhouse_dsn=f"chdb://{tmp_path / 'chdb'}")
    create_topics(s)
    return s


@pytest.fixture
def processor_running(settings: Settings) -> Iterator[Settings]:
    """The lifecycle processor running as a process, on this test's topics."""
    with Stack(settings) as s:
        s.start_roles([roles.LIFECYCLE])
        yield settings


@pytest.fixture
def pipeline(settings: Settings) -> Iterator[Settings]:
    """The lifecycle processor and the span sink running as processes, on this test's topics."""
    with Stack(settings) as s:
        s.start_roles(roles.PIPELINE)
        yield settings


@pytest.fixture
def sink(settings: Settings) -> Iterator[SpanSink]:
    """The span sink running in a thread of the test, on its topics and chDB."""
    s = SpanSink(settings, batch_size=500, max_wait_s=0.2)
    thread = threading.Thread(target=s.run, daemon=True)
    thread.start()
    yield s
    s.stop_event.set()
    thread.join(30)
    s.close()
