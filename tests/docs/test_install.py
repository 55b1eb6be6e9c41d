"""Installable as the docs say: every install line works for someone with oncely's source or
its wheel (oncely is on no public index yet), checked in fresh virtual environments.

These tests build virtual environments and install from PyPI (a minute or two). Without
network access they skip, except in CI (CI=true), where they fail.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path

import pytest
import sqlalchemy as sa
from tests.conftest import _reset_postgres, _sync_url
from tests.docs.test_docs import blocks
from tests.support import IN_CI, ROOT

# Each builds a venv and installs from PyPI: minutes on a busy machine.
pytestmark = [pytest.mark.install, pytest.mark.timeout(1200)]

DOCKERFILE_DOCS = [ROOT / "docs" / "deploy-aws.md", ROOT / "docs" / "deploy-kubernetes.md"]


@pytest.fixture(scope="module")
def pypi() -> None:
    try:
        urllib.request.urlopen("https://pypi.org/simple/click/", timeout=15).close()
    except OSError as exc:
        if IN_CI:
            pytest.fail(f"PyPI is not reachable, the install tests cannot run: {exc}")
        pytest.skip(f"PyPI is not reachable: {exc}")


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without what points Python at the worktree's or another venv's code."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.pop("ONCELY_APP", None)
    return {**env, **extra}


def venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=300)
    return path / "bin"


def run(argv: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        argv, cwd=cwd, env=clean_env(**env), capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, (
        f"{shlex.join(argv)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return proc


@pytest.mark.postgres
def test_the_sync_extra_runs_the_flask_how_to_on_postgres(
    pypi: None, tmp_path: Path, postgres_database: str
) -> None:
    """`oncely[sync]` alone gives a sync `postgresql://` engine its driver (psycopg 3)."""
    bin_ = venv(tmp_path / "venv")
    run([str(bin_ / "pip"), "install", "--quiet", f"{ROOT}[sync]"], cwd=tmp_path)
    run([str(bin_ / "python"), "-c", "import psycopg"], cwd=tmp_path)
    doc = ROOT / "docs" / "how-to" / "django-flask.md"
    flask = next(b for b in blocks(doc) if b.mark == "runnable" and "claim_run_sync" in b.code)
    (tmp_path / "flask_howto.py").write_text(flask.code)
    _reset_postgres(postgres_database)
    run([str(bin_ / "python"), "flask_howto.py"], cwd=tmp_path, DATABASE_URL=postgres_database)
    engine = sa.create_engine(_sync_url(postgres_database))
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM invoices")).scalar_one() == 2
        assert conn.execute(sa.text("SELECT count(*) FROM oncely_runs")).scalar_one() == 1
    engine.dispose()


def dockerfile_run_line() -> str:
    files = []
    for doc in DOCKERFILE_DOCS:
        (dockerfile,) = [b.code for b in blocks(doc) if b.lang == "dockerfile"]
        files.append(dockerfile)
    assert files[0] == files[1], "the deploy guides show different Dockerfiles"
    (line,) = [x for x in files[0].splitlines() if x.startswith("RUN pip install")]
    return line.removeprefix("RUN ")


PROJECT = """
[build-system]
requires = ["hatchling>=1.18"]
build-backend = "hatchling.build"

[project]
name = "myproject"
version = "1.0"
dependencies = ["oncely"]

[tool.hatch.build.targets.wheel]
packages = ["myproject"]
"""
JOBS = """
from oncely import Oncely, cron

app = Oncely()


@app.job(cron("0 18 * * FRI", tz="America/Mexico_City"))
async def leaderboard_close(db, now):
    pass
"""


def test_the_dockerfile_install_line_works_in_a_clean_venv(pypi: None, tmp_path: Path) -> None:
    """The guides' `RUN pip install …`, run as written in the image's WORKDIR (a user project
    with oncely's wheel in wheels/), then the installed `oncely` runs a slot."""
    project = tmp_path / "app"
    (project / "myproject").mkdir(parents=True)
    (project / "pyproject.toml").write_text(PROJECT)
    (project / "myproject" / "__init__.py").write_text("")
    (project / "myproject" / "jobs.py").write_text(JOBS)
    # The guides' step: `python -m build --wheel` in oncely's source, the wheel in wheels/.
    run([sys.executable, "-m", "build", "--wheel", "--outdir", str(project / "wheels"), str(ROOT)],
        cwd=ROOT)  # fmt: skip
    assert [p.name for p in (project / "wheels").iterdir()] == ["oncely-0.1.0-py3-none-any.whl"]
    # PEP 561: the wheel says it is typed, so users' type checkers read oncely's annotations.
    with zipfile.ZipFile(project / "wheels" / "oncely-0.1.0-py3-none-any.whl") as wheel:
        assert "oncely/py.typed" in wheel.namelist()
    bin_ = venv(tmp_path / "venv")
    argv = shlex.split(dockerfile_run_line())
    assert argv[0] == "pip"
    run([str(bin_ / "pip"), *argv[1:]], cwd=project)
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    elsewhere = tmp_path / "elsewhere"  # the installed packages, not the source, are used
    elsewhere.mkdir()
    oncely = str(bin_ / "oncely")
    app = ["--app", "myproject.jobs:app"]
    run([oncely, *app, "migrate"], cwd=elsewhere, ONCELY_DATABASE_URL=url)
    ran = run([oncely, *app, "run", "leaderboard_close"], cwd=elsewhere, ONCELY_DATABASE_URL=url)
    assert ran.stdout.startswith("ran leaderboard_close slot ")


# -- every install line, in the docs and in oncely's messages --------------------------------

INSTALL = re.compile(r"pip install ([^`\n\"]+)")
LOCAL = re.compile(r"^['\"]?(\.|/|dist/|\./|[\w./-]+\.whl)")


def _requirements(args: str) -> list[str]:
    words = shlex.split(args.split("#", 1)[0].split("&&", 1)[0])
    out, skip = [], False
    for word in words:
        if skip:
            skip = False
            continue
        if word in ("--find-links", "-f", "-r", "--requirement", "-c", "--constraint"):
            skip = True
            continue
        if word.startswith("-"):
            continue
        out.append(word)
    return out


def test_no_install_line_needs_oncely_on_a_public_index() -> None:
    """`pip install oncely` / `pip install 'oncely[x]'` only with --find-links to a wheel;
    everything else installs oncely from a path (its source or its wheel)."""
    sources = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    sources += sorted((ROOT / "src").rglob("*.py"))
    wrong = []
    for path in sources:
        for match in INSTALL.finditer(path.read_text()):
            args = match.group(1)
            for req in _requirements(args):
                named = re.match(r"^oncely(\[|$)", req)
                if named and "--find-links" not in args and "-f " not in args:
                    wrong.append(f"{path.relative_to(ROOT)}: pip install {args.strip()}")
    assert wrong == []
