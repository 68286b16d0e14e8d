"""Static validation of the production docker-compose.yml.

No Docker engine is needed: the file is checked against the Compose
Specification JSON schema and against this project's own rules (KRaft Kafka,
ClickHouse, healthchecks, one litstream image, loopback-only published ports).
If a ``docker-compose`` binary is on PATH, ``docker-compose config -q`` is run
as well.

Usage::

    python tools/compose_check.py [docker-compose.yml]      (``make compose-check``)

Exit status: 0 when the file passes, 1 when problems were found, 2 when the
check could not run (missing dependency, unreadable file).

Vendored schema: ``compose-spec.schema.json`` beside this file is the Compose
Specification schema (``schema/compose-spec.json`` of
github.com/compose-spec/compose-spec, Apache License 2.0, Copyright The Compose
Specification Authors), taken unchanged from the ``vendor.compose-spec`` copy
shipped in the check-jsonschema 0.39.0 package; sha256
d549057ebc2925f39f62799eab0db7b9e2c18b35b6c00595199116da3ed10e64.

Only the standard library, PyYAML and jsonschema are used, and no relative
imports, so the module also runs as a plain script.
"""

from __future__ import annotations

import ipaddress
import json
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

try:
    import yaml
except ImportError:  # reported by main(); the module must still import
    yaml = None  # type: ignore[assignment]

try:
    import jsonschema
except ImportError:
    jsonschema = None  # type: ignore[assignment]

SCHEMA_PATH = Path(__file__).with_name("compose-spec.schema.json")

REQUIRED_SERVICES = ("kafka", "clickhouse", "topics", "lifecycle", "span-sink", "gateway", "runner")
# Services built from this repository: all must run the same image.
LITSTREAM_SERVICES = ("topics", "lifecycle", "span-sink", "gateway", "runner")
HEALTHCHECK_TIMING = ("interval", "timeout", "retries", "start_period")


class CheckError(Exception):
    """The check itself could not run (as opposed to the file having problems)."""


def load_compose(path: str | Path) -> dict[str, Any]:
    """Parse a compose file; YAML anchors and merge keys are resolved by PyYAML."""
    if yaml is None:
        raise CheckError("PyYAML is not installed: pip install pyyaml")
    try:
        with open(path, encoding="utf-8") as fh:
            doc = yaml.safe_load(fh)
    except OSError as exc:
        raise CheckError(f"cannot read {path}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise CheckError(f"{path} is not valid YAML: {exc}") from exc
    if not isinstance(doc, dict):
        raise CheckError(f"{path}: top level is not a mapping")
    unshared: dict[str, Any] = _unshare(doc)
    return unshared


def validate_schema(doc: Mapping[str, Any], schema_path: Path = SCHEMA_PATH) -> list[str]:
    """Problems reported by the Compose Specification JSON schema."""
    if jsonschema is None:
        raise CheckError("jsonschema is not installed: pip install jsonschema")
    try:
        schema = json.loads(schema_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckError(f"cannot load compose schema {schema_path}: {exc}") from exc
    # Use the draft the schema declares in "$schema" (older releases used Draft 7).
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    cls.check_schema(schema)
    errors = list(cls(schema).iter_errors(doc))
    # A failing property also makes 2020-12 "unevaluatedProperties" flag its
    # valid siblings; that echo is dropped when a more specific error exists.
    deeper = {tuple(e.absolute_path)[:i] for e in errors for i in range(len(e.absolute_path))}
    errors = [
        e for e in errors if e.validator != "unevaluatedProperties" or tuple(e.absolute_path) not in deeper
    ]
    errors = [_most_specific(e) for e in errors]
    errors.sort(key=lambda e: list(map(str, e.absolute_path)))
    return [f"schema: {_path(e.absolute_path)}: {e.message}" for e in errors]


def check_rules(doc: Mapping[str, Any]) -> list[str]:
    """Problems with respect to the litstream stack's own rules."""
    problems: list[str] = []
    if "version" in doc:
        problems.append("top-level 'version' is obsolete in the Compose Specification; remove it")
    services = doc.get("services")
    if not isinstance(services, Mapping) or not services:
        return [*problems, "no services defined"]

    for name in REQUIRED_SERVICES:
        if name not in services:
            problems.append(f"missing service '{name}'")

    problems += _check_kafka(services)
    clickhouse = services.get("clickhouse")
    if isinstance(clickhouse, Mapping) and not _image_is(clickhouse, "clickhouse/clickhouse-server"):
        problems.append(
            f"clickhouse: image must be clickhouse/clickhouse-server, got {clickhouse.get('image')!r}"
        )

    # The stack's own roles plus anything else built from this repository.
    built = [n for n, svc in services.items() if isinstance(svc, Mapping) and "build" in svc]
    ours = [n for n in LITSTREAM_SERVICES if isinstance(services.get(n), Mapping)]
    images = {n: services[n].get("image") for n in dict.fromkeys(ours + built)}
    if len(set(images.values())) > 1 or None in images.values():
        listed = ", ".join(f"{n}={i!r}" for n, i in images.items())
        problems.append(f"litstream services must all use one image: {listed}")

    one_shot = _one_shot_services(services)
    for name, svc in services.items():
        if not isinstance(svc, Mapping):
            continue
        if name in one_shot:
            # A restarting one-shot job never "completes", so its dependants never start.
            restart = str(svc.get("restart", "no"))
            if restart != "no" and not restart.startswith("on-failure"):
                problems.append(
                    f"{name}: one-shot service must use restart 'no' or 'on-failure', not {restart!r}"
                )
        else:
            problems += _check_healthcheck(name, svc)
        problems += _check_ports(name, svc)
    return problems


def check_document(doc: Mapping[str, Any]) -> list[str]:
    """Schema problems followed by project-rule problems."""
    return validate_schema(doc) + check_rules(doc)


def docker_compose_config(path: str | Path) -> tuple[str, list[str]] | None:
    """Run ``docker-compose -f PATH config -q`` if that binary exists; None otherwise."""
    exe = shutil.which("docker-compose")
    if exe is None:
        return None
    try:
        version = subprocess.run(
            [exe, "version", "--short"], check=False, capture_output=True, text=True, timeout=60
        ).stdout.strip()
        proc = subprocess.run(
            [exe, "-f", str(path), "config", "-q"], check=False, capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return "docker-compose", [f"docker-compose config could not run: {exc}"]
    label = f"docker-compose {version}".strip()
    if proc.returncode == 0:
        return label, []
    output = (proc.stderr or proc.stdout).strip() or f"exit status {proc.returncode}"
    return label, [f"{label} config: {line.strip()}" for line in output.splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) > 1 or (args and args[0] in ("-h", "--help")):
        print("usage: compose_check.py [docker-compose.yml]", file=sys.stderr)
        return 2
    path = Path(args[0]) if args else _default_path()
    try:
        problems = check_document(load_compose(path))
    except CheckError as exc:
        print(f"compose_check: {exc}", file=sys.stderr)
        return 2
    external = docker_compose_config(path)
    if external is not None:
        problems += external[1]
    if problems:
        print(f"{path}: {len(problems)} problem(s):")
        for problem in problems:
            print(f"  - {problem}")
        return 1
    extra = f"; {external[0]} config ok" if external is not None else ""
    print(f"OK {path}: compose-spec schema and litstream stack rules pass{extra}")
    return 0


# --- helpers -----------------------------------------------------------------


def _path(parts: Iterable[Any]) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(root)"


def _most_specific(error: Any) -> Any:
    """For oneOf/anyOf failures, the error of the alternative that got deepest.

    A type mismatch against the wrong alternative ("is not of type 'array'")
    says less than the failure inside the alternative the value was meant for.
    """
    while error.context:
        depth = max(len(c.absolute_path) for c in error.context)
        if depth <= len(error.absolute_path):
            break  # no alternative fits better: keep "not valid under any of the given schemas"
        error = jsonschema.exceptions.best_match(c for c in error.context if len(c.absolute_path) == depth)
    return error


def _unshare(node: Any) -> Any:
    """Copy of the parsed tree without YAML alias sharing, so edits stay local."""
    if isinstance(node, dict):
        return {key: _unshare(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_unshare(value) for value in node]
    return node


def _default_path() -> Path:
    """./docker-compose.yml, else the one at the repository root (this file's folder's parent)."""
    cwd = Path("docker-compose.yml")
    return cwd if cwd.exists() else Path(__file__).resolve().parents[1] / "docker-compose.yml"


def _image_is(svc: Mapping[str, Any], repo: str) -> bool:
    """True when the image is ``repo`` with any tag or digest (registry prefixes allowed)."""
    name = str(svc.get("image") or "").split("@", 1)[0]
    head, _, last = name.rpartition("/")
    name = f"{head}/{last.split(':', 1)[0]}" if head else last.split(":", 1)[0]
    return name == repo or name.endswith("/" + repo)


def _environment(svc: Mapping[str, Any]) -> dict[str, str]:
    """Normalise the mapping and the list ("KEY=VALUE") forms of `environment`."""
    env = svc.get("environment") or {}
    if isinstance(env, Mapping):
        return {str(k): "" if v is None else str(v) for k, v in env.items()}
    pairs = (str(item).partition("=") for item in env)
    return {key: value for key, _, value in pairs}


def _check_kafka(services: Mapping[str, Any]) -> list[str]:
    problems: list[str] = []
    for name, svc in services.items():
        image = str(svc.get("image") or "") if isinstance(svc, Mapping) else ""
        if "zookeeper" in str(name).lower() or "zookeeper" in image.lower():
            problems.append(f"{name}: ZooKeeper is not used; Kafka must run in KRaft mode")
        elif isinstance(svc, Mapping) and "KAFKA_ZOOKEEPER_CONNECT" in _environment(svc):
            problems.append(f"{name}: KAFKA_ZOOKEEPER_CONNECT set; Kafka must run in KRaft mode")
    kafka = services.get("kafka")
    if not isinstance(kafka, Mapping):
        return problems
    if not _image_is(kafka, "apache/kafka"):
        problems.append(f"kafka: image must be apache/kafka, got {kafka.get('image')!r}")
    roles = {r.strip() for r in _environment(kafka).get("KAFKA_PROCESS_ROLES", "").split(",")}
    if not {"broker", "controller"} <= roles:
        problems.append("kafka: KAFKA_PROCESS_ROLES must contain broker and controller (KRaft combined mode)")
    return problems


def _one_shot_services(services: Mapping[str, Any]) -> set[str]:
    """Services that others wait on to *complete*: jobs, not long-running daemons."""
    found: set[str] = set()
    for svc in services.values():
        deps = svc.get("depends_on") if isinstance(svc, Mapping) else None
        if isinstance(deps, Mapping):
            found.update(
                dep
                for dep, cond in deps.items()
                if isinstance(cond, Mapping) and cond.get("condition") == "service_completed_successfully"
            )
    return found


def _check_healthcheck(name: str, svc: Mapping[str, Any]) -> list[str]:
    hc = svc.get("healthcheck")
    if (
        not isinstance(hc, Mapping)
        or hc.get("disable")
        or not hc.get("test")
        or hc.get("test") in (["NONE"], "NONE")
    ):
        return [f"{name}: long-running service has no healthcheck"]
    missing = [key for key in HEALTHCHECK_TIMING if key not in hc]
    return [f"{name}: healthcheck lacks {', '.join(missing)}"] if missing else []


def _check_ports(name: str, svc: Mapping[str, Any]) -> list[str]:
    """Published ports must bind a loopback address explicitly."""
    if svc.get("network_mode") == "host":
        return [f"{name}: network_mode 'host' publishes every port on all interfaces"]
    problems: list[str] = []
    for port in svc.get("ports") or []:
        host_ip = _host_ip(port)
        if not _is_loopback(host_ip):
            where = "all interfaces" if host_ip in (None, "", "0.0.0.0", "::") else host_ip
            problems.append(f"{name}: port {port!r} is published on {where}; bind it to 127.0.0.1")
    return problems


def _host_ip(port: Any) -> str | None:
    """The host address of a short ("[IP:]HOST:CONTAINER[/proto]") or long port entry."""
    if isinstance(port, Mapping):
        return None if port.get("host_ip") is None else str(port["host_ip"])
    spec = str(port).split("/", 1)[0]
    if spec.startswith("["):  # IPv6 host address: "[::1]:8080:80"
        return spec[1 : spec.find("]")]
    parts = spec.split(":")
    return parts[0] if len(parts) == 3 else None


def _is_loopback(host_ip: str | None) -> bool:
    try:
        return host_ip is not None and ipaddress.ip_address(host_ip).is_loopback
    except ValueError:
        return False


if __name__ == "__main__":
    sys.exit(main())
