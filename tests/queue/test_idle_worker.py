"""An idle worker that notifications wake sends next to nothing, yet starts delayed tasks at
their time and notices tasks enqueued while its LISTEN connection was down (Postgres)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from queue_helpers import in_tx  # type: ignore[import-not-found]
from sqlalchemy import event
from sqlalchemy.engine import Engine

from oncely import Oncely, TaskState
from oncely.queue import worker
from oncely.work.tasks import TaskWorker
from oncely.work.tasks import timing as lanes

pytestmark = pytest.mark.postgres


async def until(
    check: Callable[[], Awaitable[bool] | bool], what: str, timeout: float = 30
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if not isinstance(got, bool):
            got = await got
        if got:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        await asyncio.sleep(0.02)


@asynccontextmanager
async def running(app: Oncely, **options: Any) -> AsyncIterator[TaskWorker]:
    """A task worker consuming until the block ends, once its LISTEN works and its first look
    after that is done."""
    lanes_worker = worker(app, **options)
    stopping = asyncio.Event()
    task = asyncio.create_task(lanes_worker.consume(stopping))
    try:
        await until(
            lambda: lanes_worker.listening and lanes_worker.leaser.looked is not None,
            "the worker to listen",
        )
        yield lanes_worker
    finally:
        stopping.set()
        await asyncio.wait_for(task, 30)


class Statements:
    """Every statement SQLAlchemy sends in this process (every engine), while counting."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.counting = False

    def __call__(self, _conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if self.counting:
            self.sent.append(" ".join(statement.split())[:80])


@pytest.fixture
def statements() -> Any:
    seen = Statements()
    event.listen(Engine, "before_cursor_execute", seen)
    yield seen
    event.remove(Engine, "before_cursor_execute", seen)


async def test_an_idle_listening_worker_sends_few_statements(
    pg_app: Oncely, statements: Statements
) -> None:
    @pg_app.task
    async def note(db, n: int) -> None:  # type: ignore[no-untyped-def]
        pass

    # poll=0.2: a worker that still polled while notifications wake it would send 5
    # statements a second; the lease (30 s) puts the rescuer at one statement per 10 s.
    async with running(pg_app, poll=0.2, lease=30, concurrency=10) as lanes_worker:
        statements.counting = True
        await asyncio.sleep(6.0)  # a window to count in, not a synchronisation
        statements.counting = False
        assert lanes_worker.listening
    # In 6 s: at most one fallback look (a lease and when the next task is due), one rescue
    # and one sign of life, each due every 10 s, and a reconnect's few.
    assert len(statements.sent) < 8, statements.sent


async def test_a_delayed_task_wakes_a_listening_worker_at_its_time(
    pg_app: Oncely, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No fallback look within the test: only the task's own time can wake the worker.
    monkeypatch.setattr(lanes, "LISTENING_POLL_S", 600.0)

    @pg_app.task
    async def note(db, n: int) -> None:  # type: ignore[no-untyped-def]
        pass

    async with running(pg_app, poll=600.0):
        rec = await in_tx(pg_app, lambda db: note.enqueue(db, n=1, delay=timedelta(seconds=1)))

        async def done() -> bool:
            return (await pg_app.task_record(rec.id)).state is TaskState.SUCCEEDED

        await until(done, "the delayed task to run", timeout=60)
    ran = await pg_app.task_record(rec.id)
    assert ran.started_at is not None and ran.started_at >= ran.run_at  # not before its time


async def test_a_retry_due_before_the_worker_looks_again_runs_at_its_time(
    pg_app: Oncely, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A retry 10 ms away comes due before the leaser's next look (it waits a moment after a
    short lease, then asks when the next task is due): that look must lease it, not see
    nothing due later and sleep until the fallback look (here 600 s)."""
    from oncely import RetryPolicy

    monkeypatch.setattr(lanes, "LISTENING_POLL_S", 600.0)
    calls: list[int] = []

    @pg_app.task(retry=RetryPolicy(attempts=4, wait=0.01, backoff="fixed", jitter=0))
    async def flaky(db, n: int) -> None:  # type: ignore[no-untyped-def]
        calls.append(n)
        if len(calls) < 4:
            raise RuntimeError(f"gateway timeout #{len(calls)}")

    async with running(pg_app, poll=600.0):
        rec = await in_tx(pg_app, lambda db: flaky.enqueue(db, n=1))

        async def done() -> bool:
            return (await pg_app.task_record(rec.id)).state is TaskState.SUCCEEDED

        await until(done, "three retries 10 ms apart", timeout=20)
    assert calls == [1, 1, 1, 1]
    assert (await pg_app.task_record(rec.id)).attempt == 4


async def test_a_short_delay_that_runs_out_while_the_worker_waits_to_look_is_leased(
    pg_app: Oncely, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tasks enqueued 20 ms ahead, one after another: each notification wakes a lease that
    finds it not yet due, and it comes due before the worker's next look asks when."""
    monkeypatch.setattr(lanes, "LISTENING_POLL_S", 600.0)

    @pg_app.task
    async def note(db, n: int) -> None:  # type: ignore[no-untyped-def]
        pass

    async with running(pg_app, poll=600.0):
        recs = [
            await in_tx(pg_app, lambda db, n=n: note.enqueue(db, n=n, delay=0.02)) for n in range(5)
        ]

        async def done() -> bool:
            states = [(await pg_app.task_record(r.id)).state for r in recs]
            return all(s is TaskState.SUCCEEDED for s in states)

        await until(done, "five tasks 20 ms ahead", timeout=20)


async def test_a_task_due_just_after_the_lease_looked_is_found_when_the_next_look_is_late(
    pg_app: Oncely, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The look after a short lease counts the tasks due since that lease began, measured on
    the worker's clock; its statement reaches the server later than the lease's did (a loaded
    loop, a prepare, a slow round trip). A task that came due in between was neither due for
    the lease nor counted by the look, and waited for the fallback look (here 600 s)."""
    monkeypatch.setattr(lanes, "LISTENING_POLL_S", 600.0)
    store = pg_app.store.tasks
    next_due = store.next_due
    looks: list[float] = []

    async def late(*args: Any, **kwargs: Any) -> Any:
        looks.append(kwargs["since"])
        await asyncio.sleep(0.15)  # the injected lateness: the statement starts 150 ms after
        return await next_due(*args, **kwargs)

    @pg_app.task
    async def note(db, n: int) -> None:  # type: ignore[no-untyped-def]
        pass

    async with running(pg_app, poll=600.0):
        monkeypatch.setattr(store, "next_due", late)
        rec = await in_tx(pg_app, lambda db: note.enqueue(db, n=1, delay=0.04))

        async def done() -> bool:
            return (await pg_app.task_record(rec.id)).state is TaskState.SUCCEEDED

        await until(done, "a task due 40 ms after its lease looked", timeout=20)
    assert looks  # the late look is the one that found it


async def test_tasks_enqueued_while_listen_was_down_are_found_when_it_is_back(
    pg_app: Oncely, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lanes, "LISTENING_POLL_S", 600.0)
    monkeypatch.setattr(lanes, "LISTEN_RETRY_FIRST_S", 2.0)

    @pg_app.task
    async def note(db, n: int) -> None:  # type: ignore[no-untyped-def]
        pass

    kill = sa.text(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE datname = current_database() AND query LIKE 'LISTEN %' AND pid <> pg_backend_pid()"
    )
    async with running(pg_app, poll=600.0) as lanes_worker:
        async with pg_app.store.engine.begin() as conn:
            assert (await conn.execute(kill)).all() == [(True,)]
        await until(lambda: not lanes_worker.listening, "the worker to notice the lost LISTEN")
        rec = await in_tx(pg_app, lambda db: note.enqueue(db, n=1))
        missed = not lanes_worker.listening  # its notification reached no one of this worker

        async def done() -> bool:
            return (await pg_app.task_record(rec.id)).state is TaskState.SUCCEEDED

        await until(done, "the task enqueued meanwhile to run", timeout=60)
        assert lanes_worker.listening  # LISTEN is back
    assert missed


Hang = Callable[[TaskWorker], Awaitable[bool]]


@asynccontextmanager
async def three_workers(
    app: Oncely, monkeypatch: pytest.MonkeyPatch, hang: Hang | None = None
) -> AsyncIterator[tuple[list[TaskWorker], dict[int, int]]]:
    """Three idle workers with turns 1.5 s apart (the order shows), each knowing the three,
    and how many leases each began once they all listened. A lease for which `hang(worker)`
    is true never returns (a worker that hangs)."""
    monkeypatch.setattr(lanes, "ANNOUNCE_EVERY", 0.5)  # each knows the three soon
    monkeypatch.setattr(lanes, "TURN_S", 1.5)
    workers = [worker(app, concurrency=2, pool_size=2) for _ in range(3)]
    stopping = asyncio.Event()
    consuming = [asyncio.create_task(w.consume(stopping)) for w in workers]
    fetches: dict[int, int] = {i: 0 for i in range(3)}
    try:
        await until(
            lambda: all(w.listening and w.wakeups.place[1] == 3 for w in workers),
            "the three workers to listen and know each other",
        )
        assert sorted(w.wakeups.place[0] for w in workers) == [0, 1, 2]
        await until(
            lambda: all(
                w.leaser.looked is not None
                and w.leaser.looked[0] == w.wakeups.news
                and w.leaser.looked[1] > time.monotonic() + 1
                for w in workers
            ),
            "the three workers to be idle (each one's last look sees nothing due soon)",
        )
        for i, w in enumerate(workers):
            real = w.leaser.fetch

            async def counted(
                want: int,
                stop: asyncio.Event,
                start: int | None = None,
                i: int = i,
                w: TaskWorker = w,
                real: Any = real,
            ) -> Any:
                fetches[i] += 1
                if hang is not None and await hang(w):
                    await stop.wait()  # until the worker stops
                    return []
                return await real(want, stop, start)

            w.leaser.fetch = counted  # type: ignore[method-assign]
        yield workers, fetches
    finally:
        stopping.set()
        await asyncio.wait_for(asyncio.gather(*consuming), 30)


async def enqueued_with_key(app: Oncely, task: Any) -> str:
    """Enqueue one `task(n=1)`; the key of its notification (its transaction's id)."""

    async def enqueue(db: Any) -> str:
        await task.enqueue(db, n=1)
        return str((await db.execute(sa.text("SELECT txid_current()"))).scalar_one())

    key: str = await in_tx(app, enqueue)
    return key


async def test_idle_workers_answer_a_notification_in_turns_the_first_says_it_is_answered(
    pg_app: Oncely, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three idle workers hear one notification: the one whose turn the notification's key
    gives leases at once and runs the task; its lease took all that was due, so it says the
    notification is answered, and the other two never lease for it. The task starts before
    that word's statement goes out (which would otherwise take the event loop first)."""
    app = pg_app
    ran: list[int] = []
    order: list[str] = []

    @app.task
    async def probe(db, n: int):  # type: ignore[no-untyped-def]
        order.append("task")
        ran.append(n)

    async with three_workers(app, monkeypatch) as (workers, fetches):
        for w in workers:
            say = w.listener.say_taken

            async def said(keys: list[str], say: Any = say) -> None:
                order.append("taken")
                await say(keys)

            w.listener.say_taken = said  # type: ignore[method-assign]
        before = dict(fetches)
        key = await enqueued_with_key(app, probe)
        waits = [w.wakeups.wait(key) for w in workers]
        assert sorted(waits) == [0.0, 1.5, 3.0]
        first = waits.index(0.0)
        others = [i for i in range(3) if i != first]
        await until(lambda: ran == [1], "the task to run")
        await until(
            lambda: all(not workers[i].wakeups.waiting for i in others),
            "the others to hear that it is answered",
        )
        assert fetches[first] > before[first]
        assert [fetches[i] - before[i] for i in others] == [0, 0]  # their turns: cancelled
        assert ran == [1]
        assert order == ["task", "taken"]


async def test_when_the_first_to_look_hangs_the_next_takes_the_task_at_its_turn(
    pg_app: Oncely, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = pg_app
    ran: list[int] = []

    @app.task
    async def probe(db, n: int):  # type: ignore[no-untyped-def]
        ran.append(n)

    enqueuing = asyncio.Event()
    known: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def first_hangs(w: TaskWorker) -> bool:
        if not enqueuing.is_set():
            return False  # the workers' looks before the task
        return w.wakeups.wait(await known) == 0.0

    async with three_workers(app, monkeypatch, first_hangs) as (workers, fetches):
        enqueuing.set()
        before = dict(fetches)
        key = await enqueued_with_key(app, probe)
        known.set_result(key)
        waits = [w.wakeups.wait(key) for w in workers]
        first, second = waits.index(0.0), waits.index(1.5)
        await until(lambda: ran == [1], "the task to run", 15)
        assert fetches[first] - before[first] == 1  # its lease hangs
        assert fetches[second] > before[second]  # took it at its turn
        assert ran == [1]


async def test_only_a_worker_that_leases_the_same_queues_and_names_cancels_a_turn(
    pg_app: Oncely,
) -> None:
    """A `taken` message names the queues and task names of the worker that says it: a
    worker of other queues (whose lease did not look where this one's would) leaves this
    worker's turn standing; one of the same queues and names cancels it."""
    app = pg_app

    @app.task
    async def probe(db, n: int):  # type: ignore[no-untyped-def]
        return None

    mine = worker(app, queues=["mail"])
    same = worker(app, queues=["mail"])
    other = worker(app, queues=["reports"])
    assert mine.wakeups.scope == same.wakeups.scope != other.wakeups.scope
    mine.wakeups.place = (1, 2)
    key = next(k for k in (str(n) for n in range(100)) if mine.wakeups.wait(k) > 0)
    mine.notify(key)
    assert key in mine.wakeups.waiting  # waits for its turn
    mine.notify(f"taken:{other.wakeups.scope}:{key}")
    assert key in mine.wakeups.waiting  # another scope's word: the turn stands
    turn = mine.listener.timer
    assert turn is not None  # armed for that turn
    mine.notify(f"taken:{same.wakeups.scope}:{key}")
    assert key not in mine.wakeups.waiting and turn.cancelled() and mine.listener.timer is None


async def test_a_worker_that_starts_or_stops_is_in_the_others_turns_at_once(
    pg_app: Oncely, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Turns agree as soon as a worker starts or stops, not at the next sign of life (an
    hour here): a worker that starts says so, and so does one that stops, and every worker
    reads its place again."""
    monkeypatch.setattr(lanes, "ANNOUNCE_EVERY", 3600.0)
    app = pg_app
    async with running(app) as alone:
        await until(lambda: alone.wakeups.place == (0, 1), "the first worker to know it is alone")
        async with running(app) as second:
            await until(
                lambda: alone.wakeups.place[1] == 2 and second.wakeups.place[1] == 2,
                "both workers to know of each other",
                timeout=10,
            )
            assert sorted([alone.wakeups.place[0], second.wakeups.place[0]]) == [0, 1]
        await until(
            lambda: alone.wakeups.place == (0, 1), "the first to know the second stopped", 10
        )


async def test_a_worker_alone_says_no_notification_is_answered(
    pg_app: Oncely, statements: Statements
) -> None:
    """No other worker waits for a turn: a lone worker answers a notification without a
    word to anyone (one statement less per task enqueued)."""
    ran: list[int] = []

    @pg_app.task
    async def probe(db, n: int):  # type: ignore[no-untyped-def]
        ran.append(n)

    async with running(pg_app) as alone:
        await until(lambda: alone.wakeups.place == (0, 1), "the worker to know it is alone")
        statements.counting = True
        await enqueued_with_key(pg_app, probe)
        await until(lambda: ran == [1], "the task to run")
        statements.counting = False
    assert any("oncely_tasks" in s and "WITH" in s for s in statements.sent), statements.sent
    assert not [s for s in statements.sent if "pg_notify" in s], statements.sent
