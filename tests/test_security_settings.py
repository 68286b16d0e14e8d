"""Kafka security settings from the environment reach every client: librdkafka's and Faust's."""

from __future__ import annotations

import pytest

from litstream.infra.client_config import security_config
from litstream.infra.settings import Settings
from litstream.streams.lifecycle import faust_broker_credentials


def test_sasl_and_tls_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LITSTREAM_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("LITSTREAM_KAFKA_SASL_MECHANISM", "SCRAM-SHA-512")
    monkeypatch.setenv("LITSTREAM_KAFKA_SASL_USERNAME", "agent")
    monkeypatch.setenv("LITSTREAM_KAFKA_SASL_PASSWORD", "s3cret")
    s = Settings()
    assert security_config(s) == {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
                                  "sasl.username": "agent", "sasl.password": "s3cret"}
    creds = faust_broker_credentials(s)["broker_credentials"]
    assert (creds.username, creds.password, str(creds.mechanism.value)) == ("agent", "s3cret", "SCRAM-SHA-512")
    assert "s3cret" not in repr(s)  # the password never shows in logs of the settings


def test_plaintext_adds_nothing() -> None:
    s = Settings()
    assert security_config(s) == {} and faust_broker_credentials(s) == {}


def test_a_misspelled_setting_is_refused_with_the_valid_names(monkeypatch: pytest.MonkeyPatch) -> None:
    from litstream.infra.settings import UnknownSettingError

    monkeypatch.setenv("LITSTREAM_PARTITON", "3")
    with pytest.raises(UnknownSettingError, match="LITSTREAM_PARTITON .did you mean LITSTREAM_PARTITIONS") as info:
        Settings()
    assert "LITSTREAM_BOOTSTRAP_SERVERS" in str(info.value)  # the full list of valid names


def test_variables_of_tools_and_tests_are_not_settings_but_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LITSTREAM_FAILPOINTS", "")
    monkeypatch.setenv("LITSTREAM_SLOW", "1")
    assert Settings().partitions >= 1


def test_every_litstream_variable_the_project_reads_is_known() -> None:
    """A variable read by code, CI or compose but unknown to the strict check would stop every command."""
    import re
    from pathlib import Path

    from litstream.infra.settings import OTHER_VARIABLES, Settings

    root = Path(__file__).resolve().parent.parent
    known = {f"LITSTREAM_{name.upper()}" for name in Settings.model_fields} | OTHER_VARIABLES
    misspelt_on_purpose = {"LITSTREAM_PARTITON", "LITSTREAM_BOOTSTRAP_SERVER"}
    files = [*root.glob("*/*.py"), *root.glob("*/*/*.py"), root / ".ci" / "run", root / "docker-compose.yml",
             root / "Makefile"]
    used = {v for f in files if f.is_file() and ".venv" not in f.parts
            for v in re.findall(r"\bLITSTREAM_[A-Z][A-Z0-9_]*[A-Z0-9]\b", f.read_text(errors="replace"))}
    used -= misspelt_on_purpose | {"LITSTREAM_SERVICES"}  # a constant's name in tools/compose_check.py
    assert used <= known, sorted(used - known)
