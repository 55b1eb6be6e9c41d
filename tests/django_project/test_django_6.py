"""The Django project's suite on Django 6.x, its built-in `django.tasks` in place of the
backport: in a virtual environment of Python 3.12+ (Django 6 needs it), with oncely installed
from this checkout as `oncely[django]`, on SQLite and Postgres.

The suite itself runs on the Python that runs pytest (Django 5.2 LTS with the django-tasks
backport, as CI installs `.[test]`); this test runs it once more in the other environment:
every test on Postgres, and on SQLite the tests of the task backend (the files
`test_django_task*`, where Django 6's own `django.tasks` replaces the backport); the jobs',
claims' and admin's tests on SQLite run on Django 5.2 only.
Without Python 3.12+ or PyPI it skips, except in CI (CI=true), where it fails. The venv is
kept in pytest's cache between runs on one machine (keyed on pyproject.toml, the Python and
SUITE_NEEDS); oncely itself is reinstalled from the checkout every time.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from tests.docs.test_install import clean_env, pypi, run
from tests.support import IN_CI, ROOT

__all__ = ["pypi"]  # the fixture, for this test

pytestmark = [pytest.mark.install, pytest.mark.postgres, pytest.mark.timeout(900)]

DJANGO = "Django>=6.0,<6.2"
SUITE_NEEDS = [
    *("pytest>=8", "pytest-asyncio>=0.24", "pytest-timeout>=2.3", "psycopg2-binary>=2.9"),
    *("opentelemetry-api>=1.20", "opentelemetry-sdk>=1.20"),  # the enqueue's trace test
    "playwright>=1.64,<1.65",  # the admin in Chromium (Debian's: no browser download)
]
"""What tests/conftest.py and the suite's tests need besides `oncely[django]`."""

TASK_FILES = "test_django_task"
"""The files of the task backend's tests (`test_django_task*.py`): the ones run on SQLite too."""


def python312() -> str:
    """A Python of 3.12 or later: $ONCELY_TEST_PYTHON312, python3.12 (… 3.14) on PATH, or
    one of pyenv's versions (a pyenv shim on PATH may name a version that is not enabled)."""
    candidates = [os.environ.get("ONCELY_TEST_PYTHON312")]
    candidates += [shutil.which(f"python3.{minor}") for minor in (12, 13, 14)]
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates += sorted(glob.glob(str(pyenv / "versions" / "3.1[234]*" / "bin" / "python3")))
    for candidate in candidates:
        if not candidate:
            continue
        try:
            probe = subprocess.run(
                [candidate, "-c", "import sys, venv; print(sys.version_info >= (3, 12))"],
                capture_output=True,
                text=True,
                timeout=60,
            )
        except OSError:
            continue
        if probe.returncode == 0 and probe.stdout.strip() == "True":
            return candidate
    message = "no Python 3.12+ found (Django 6 needs it): set $ONCELY_TEST_PYTHON312"
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


def django6_venv(python: str, where: Path) -> Path:
    """A venv of `python` with Django 6.x and what the suite needs (kept while pyproject.toml,
    the Python and SUITE_NEEDS stay the same), and oncely freshly installed from the checkout."""
    version = subprocess.run(
        [python, "-c", "import sys; print(sys.version)"], capture_output=True, text=True
    ).stdout
    needs = (ROOT / "pyproject.toml").read_text() + version + " ".join(SUITE_NEEDS)
    key = hashlib.sha256(needs.encode()).hexdigest()
    venv, stamp = where / "venv", where / "venv.key"
    bin_ = venv / "bin"
    if not (stamp.exists() and stamp.read_text() == key and (bin_ / "python").exists()):
        shutil.rmtree(venv, ignore_errors=True)
        stamp.unlink(missing_ok=True)
        run([python, "-m", "venv", str(venv)], cwd=where)
        deps = [f"{ROOT}[django]", DJANGO, *SUITE_NEEDS]
        run([str(bin_ / "pip"), "install", "--quiet", *deps], cwd=where)
        stamp.write_text(key)
    reinstall = ["install", "--quiet", "--no-deps", "--force-reinstall", str(ROOT)]
    run([str(bin_ / "pip"), *reinstall], cwd=where)
    return bin_


def test_the_django_project_suite_passes_on_django_6(
    pypi: None, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    python = python312()
    cache = getattr(request.config, "cache", None)  # None under -p no:cacheprovider
    where = cache.mkdir("django6") if cache is not None else tmp_path
    bin_ = django6_venv(python, Path(where))
    probe = "import django, oncely; print(django.VERSION[0], oncely.__file__)"
    installed = run([str(bin_ / "python"), "-c", probe], cwd=tmp_path).stdout.split()
    assert installed[0] == "6", installed
    assert Path(installed[1]).is_relative_to(bin_.parent), "oncely is the venv's, not the source"
    # The suite but this test (on SQLite, the task backend's files only); from the checkout
    # (its tests/), with the venv's oncely.
    argv = [
        str(bin_ / "python"), "-m", "pytest", "tests/django_project", "-m", "not install",
        "-k", f"not default or {TASK_FILES}",
        "-v", "-p", "no:cacheprovider", "--basetemp", str(tmp_path / "inner"),
    ]  # fmt: skip
    proc = subprocess.run(
        argv, cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=800
    )
    tail = proc.stdout[-4000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    lines = proc.stdout.splitlines()
    assert not [line for line in lines if " SKIPPED" in line or " XFAIL" in line], tail
    # Every test that takes a database on Postgres; the task backend's also on SQLite.
    on_sqlite = {line.split(" PASSED")[0] for line in lines if "[default] PASSED" in line}
    on_postgres = {line.split(" PASSED")[0] for line in lines if "[pg] PASSED" in line}
    assert len(on_postgres) >= 40 and len(on_sqlite) >= 20, tail
    assert all(f"::{TASK_FILES}" not in t and f"/{TASK_FILES}" in t for t in on_sqlite), tail
    assert {t.replace("[default]", "[pg]") for t in on_sqlite} <= on_postgres, tail
    schemas = "test_django_schema.py::test_the_two_schemas_are_identical_on_postgres PASSED"
    assert any(schemas in line for line in lines), tail
