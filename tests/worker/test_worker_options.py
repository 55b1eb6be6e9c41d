"""A worker's options are checked once, when the app builds them, before anything runs; the app
hands them (with its store and registries) to the services, its lease as the default."""

from __future__ import annotations

from typing import Any

import pytest

from oncely import BadInputError, Oncely, config
from oncely.work.options import WorkerOptions


def test_the_options_default_to_the_config_and_take_the_apps_lease(tmp_path: Any) -> None:
    app = Oncely(f"sqlite:///{tmp_path / 'unused.db'}", lease=7)

    @app.task
    async def note(db) -> None:  # type: ignore[no-untyped-def]
        pass

    worker = app.task_worker()
    assert worker.options == WorkerOptions(lease=7.0)
    assert worker.options.concurrency == config.CONCURRENCY
    assert worker.options.pool_size == config.POOL_SIZE
    assert worker.options.shutdown_timeout == config.SHUTDOWN_TIMEOUT
    assert worker.store is app.store and worker.tasks is app.tasks
    assert app.task_worker(lease=3, queues=["a"]).options.lease == 3.0
    assert app.task_worker(queues=[]).options.queues is None  # empty: every queue


def test_jobs_none_means_all_and_empty_means_none() -> None:
    assert WorkerOptions.of().jobs is None
    assert WorkerOptions.of(jobs=[]).jobs == ()
    assert WorkerOptions.of(jobs=["a", "b"]).jobs == ("a", "b")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"concurrency": -1}, "concurrency must be an integer >= 0, got -1"),
        ({"concurrency": True}, "concurrency must be an integer >= 0"),
        ({"pool_size": 0}, "pool_size must be an integer >= 1, got 0"),
        ({"batch": 0}, "batch must be an integer >= 1, got 0"),
        ({"lease": 0}, "the lease must be a finite number > 0, got 0"),
        ({"poll": float("nan")}, "poll must be a finite number > 0"),
    ],
)
def test_bad_options_are_refused_before_anything_runs(
    tmp_path: Any, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(BadInputError, match=message):
        WorkerOptions.of(**options)
    app = Oncely(f"sqlite:///{tmp_path / 'unused.db'}")
    with pytest.raises(BadInputError, match=message):
        app.task_worker(**options)
    assert not (tmp_path / "unused.db").exists()


def test_a_task_worker_needs_a_concurrency_of_one_or_more(tmp_path: Any) -> None:
    """0 means "no tasks here" to `app.work()`; a task worker of its own cannot run none."""
    assert WorkerOptions(concurrency=0).concurrency == 0
    app = Oncely(f"sqlite:///{tmp_path / 'unused.db'}")
    with pytest.raises(BadInputError, match="concurrency must be an integer >= 1, got 0"):
        app.task_worker(concurrency=0)
