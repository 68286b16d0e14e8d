"""The wheel `pip install .` builds (what the Dockerfile installs) is whole: every module, every data file
the code opens and the `litstream` command; and it holds the product only, not the
benchmarks or the compose check.

The wheel is built from a copy of the sources (the working tree's build/ and egg-info stay untouched and
cannot leak in), then installed into a fresh virtualenv that borrows only the project venv's dependencies:
the project's editable install of litstream, which imports straight from the working tree, stays invisible.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Top-level folders with an __init__.py that are not part of the package: they run from a checkout.
NOT_PACKAGED = {"tests", "examples", "bench"}
# Files in the package's folders the wheel leaves out on purpose: configs docker-compose mounts. Any other file
# there must ship.
NOT_SHIPPED = (
    "infra/grafana/*", "infra/prometheus/*",
)
# Development tools that run from a checkout and must not ship: the benchmarks and the compose check (with its
# vendored 91 kB schema).
DEV_ONLY = ("*bench/*", "*compose_check*", "*compose-spec*")

IMPORT_PROBE = """
import importlib, json, sys, sysconfig
from pathlib import Path
site = Path(sysconfig.get_paths()["purelib"]).resolve()
failed, outside = {}, []
for name in json.loads(sys.argv[1]):
    try:
        module = importlib.import_module(name)
    except Exception as exc:
        failed[name] = repr(exc)
        continue
    places = [module.__file__] if getattr(module, "__file__", None) else list(module.__path__)
    outside += [f"{name}: {p}" for p in places if not Path(p).resolve().is_relative_to(site)]
editable = sorted(m for m in sys.modules if "__editable__" in m)
Path(sys.argv[2]).write_text(json.dumps({"failed": failed, "outside": outside, "editable": editable}))
"""

# Each data file reached the way the code reaches it at run time.
DATA_PROBE = """
from litstream.infra import broker
from litstream.infra.clickhouse import MIGRATIONS_DIR
from litstream.schemas.codec import SchemaStore
from litstream.workers.dashboard import routes
assert broker.pom_path().is_file() and broker.log4j_config_path().is_file()
assert sorted(MIGRATIONS_DIR.glob("[0-9][0-9][0-9][0-9]_*.sql"))
SchemaStore()  # opens every record's .avsc
env = routes._environment()
for name in env.list_templates():
    env.get_template(name)
assert any((routes.HERE / "static").iterdir())
"""


@functools.cache
def _package_dir() -> dict[str, str]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        mapping: dict[str, str] = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    return mapping


@functools.cache
def _source_files() -> tuple[str, ...]:
    """The tree's files as git sees them (tracked, or new and not ignored): no venv, cache or build output."""
    cmd = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    try:
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("needs a git checkout to tell sources from local files")
    return tuple(sorted(p for p in out.decode().split("\0") if p and (ROOT / p).is_file()))


def _in_wheel(source: str) -> str | None:
    """Where a source file lands in the wheel, or None outside the package's folders."""
    folder, _, rest = source.partition("/")
    for package, mapped in _package_dir().items():
        if mapped == folder and rest:
            return f"{package.replace('.', '/')}/{rest}"
    return None


def _module_names(wheel_files: list[str]) -> list[str]:
    names = {"litstream"}
    for path in wheel_files:
        parts = path.split("/")
        if parts[0] != "litstream" or not path.endswith(".py"):
            continue
        parts[-1] = parts[-1].removesuffix(".py")
        if parts[-1] == "__init__":
            parts.pop()
        if parts[-1] != "__main__":  # runs the program when imported
            names.add(".".join(parts))
    return sorted(names)


def _env() -> dict[str, str]:
    drop = {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    return env | {"PYTHONNOUSERSITE": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}


def _run(cmd: list[str | Path], cwd: Path) -> subprocess.CompletedProcess[str]:
    args = [str(c) for c in cmd]
    proc = subprocess.run(args, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=240)
    output = f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, f"{args} exited {proc.returncode}:\n{output}"
    return proc


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for rel in _source_files():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, src / rel)
    dist = tmp_path_factory.mktemp("dist")
    # No build isolation: the project venv's setuptools builds it, without the network.
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-index", "--no-build-isolation",
          "-w", dist, src], cwd=src)
    (built,) = dist.glob("litstream-*.whl")
    return built


@pytest.fixture(scope="module")
def wheel_files(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        return zf.namelist()


@pytest.fixture(scope="module")
def python(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv's interpreter, with the wheel installed and the project venv's packages importable."""
    home = tmp_path_factory.mktemp("venv")
    venv.create(home, symlinks=True, with_pip=False)
    interpreter = home / "bin" / "python"
    pip: list[str | Path] = [sys.executable, "-m", "pip", "--python", interpreter]
    _run([*pip, "install", "-q", "--no-deps", "--no-index", wheel], cwd=home)
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = _run([interpreter, "-I", "-c", purelib], cwd=home)
    # Added after the install, so pip does not see the editable litstream there. A directory named in a .pth
    # file is only appended to sys.path: the .pth files inside it (the editable install's finder) never run.
    (Path(site.stdout.strip()) / "project_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return interpreter


def test_every_package_folder_is_mapped() -> None:
    """A new top-level source folder must get its package-dir line, or it would be missing from the wheel."""
    folders = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()} - NOT_PACKAGED
    assert folders == set(_package_dir().values())
    assert all(package == f"litstream.{folder}" for package, folder in _package_dir().items())


def test_wheel_holds_every_module(wheel_files: list[str]) -> None:
    expected = {_in_wheel(p) for p in _source_files() if p.endswith(".py")} - {None}
    missing = sorted(str(p) for p in expected - set(wheel_files))
    assert not missing, f"modules left out of the wheel: {missing}"


def test_wheel_holds_every_data_file(wheel_files: list[str]) -> None:
    shipped = set(wheel_files)
    needed = {(p, _in_wheel(p)) for p in _source_files()
              if not p.endswith(".py") and not any(fnmatch.fnmatch(p, pat) for pat in NOT_SHIPPED)}
    missing = sorted(p for p, target in needed if target is not None and target not in shipped)
    assert not missing, f"add to [tool.setuptools.package-data] (or NOT_SHIPPED here): {missing}"


def test_wheel_leaves_out_the_development_tools(wheel_files: list[str]) -> None:
    """The benchmarks and the compose check are not part of the product: neither is in the wheel."""
    shipped = [p for p in wheel_files if any(fnmatch.fnmatch(p, pat) for pat in DEV_ONLY)]
    assert shipped == []
    assert not any(p.startswith(("litstream/bench/", "bench/")) for p in wheel_files)
    assert "litstream/infra/compose_check.py" not in wheel_files


def test_installed_wheel_imports_every_module(python: Path, wheel_files: list[str], tmp_path: Path) -> None:
    names = _module_names(wheel_files)
    assert "litstream.workers.policy_server" in names
    report = tmp_path / "imports.json"
    _run([python, "-I", "-c", IMPORT_PROBE, json.dumps(names), report], cwd=tmp_path)
    result = json.loads(report.read_text())
    assert result["editable"] == [], "the project's editable install leaked into the fresh venv"
    assert result["outside"] == [], "modules imported from outside the fresh venv"
    assert result["failed"] == {}


def test_installed_code_finds_its_data(python: Path, tmp_path: Path) -> None:
    _run([python, "-I", "-c", DATA_PROBE], cwd=tmp_path)


def test_installed_command_runs(python: Path, tmp_path: Path) -> None:
    out = _run([python.parent / "litstream", "--help"], cwd=tmp_path).stdout
    assert "policy-server" in out
