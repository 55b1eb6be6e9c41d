"""The dashboard's pages (GET): overview, job, tasks, task, audit. Each reads through the
app's public API and the store's bounded views, and renders; none changes anything."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from .. import clock
from ..errors import BadInputError, DatabaseError, UnknownJobError
from ..model import Pause, TaskRecord, TaskState
from ..registry import Job
from ..store import COUNT_CAP, TaskFilter
from . import schedule_rows, timeline
from .access import Access
from .render import Settings, access_of, error, gather, page, pretty, wrong_token
from .words import dst_shifts, in_words, verdict_words, zone_name

DEFAULT_SLOTS = 48
PAGE_SIZE = 50
NEXT_SLOTS = 5
STRIP_MINUTES = 60
STATES = [s.value for s in TaskState]
TASK_ACTIONS = {
    "retry": {TaskState.DEAD, TaskState.DISCARDED, TaskState.AVAILABLE},
    "discard": {TaskState.AVAILABLE, TaskState.RUNNING, TaskState.DEAD},
    "cancel": {TaskState.AVAILABLE, TaskState.RUNNING},
}
"""The states in which each task action applies (the API refuses it in any other)."""


async def guard(settings: Settings, request: Request) -> Access | Response:
    """The request's access, or the 403 page if the resolver refuses it (401 or 429 for a
    wrong bearer token of the dashboard's own `token`)."""
    refused = wrong_token(settings, request)
    if refused is not None:
        return refused
    access = await access_of(settings, request)
    if access is None:
        return error(settings, request, 403, "access refused: this dashboard is not open to you")
    return access


@dataclass(frozen=True)
class JobRow:
    """One job on the overview."""

    job: Job
    words: str
    zone: str
    next: list[datetime]
    shifts: list[Any]
    pause: Pause | None
    last_slot: datetime | None
    last_outcome: str | None
    last_sentence: str | None
    last_label: str | None


def strip(series: dict[str, dict[int, int]], now: datetime) -> dict[str, Any]:
    """The metric strip's bars: per series, 60 counts (oldest first) and their maximum."""
    last = int(now.timestamp() // 60)
    minutes = list(range(last - STRIP_MINUTES + 1, last + 1))
    bars = {}
    for name, counts in series.items():
        values = [counts.get(m, 0) for m in minutes]
        bars[name] = {"counts": values, "max": max(values) or 1, "total": sum(values)}
    first = datetime.fromtimestamp(minutes[0] * 60, timezone.utc)
    return {"bars": bars, "first": first, "minutes": len(minutes)}


async def overview(settings: Settings, request: Request) -> Response:
    granted = await guard(settings, request)
    if not isinstance(granted, Access):
        return granted
    app = settings.app
    await app.store.ensure_schema()
    now, pauses = await gather(app.store.database_time(), app.pauses())
    views = app.store.views
    jobs = list(app.registry)
    counts, queues, duplicates, series, last, schedules = await gather(
        views.task_counts(),
        views.live_by_queue(),
        views.duplicates_since(now - timedelta(hours=24)),
        views.per_minute(now - timedelta(minutes=STRIP_MINUTES)),
        timeline.last_outcomes(app, jobs, now, pauses),
        schedule_rows.overview_rows(settings, now),
    )
    rows = [
        JobRow(
            job=job,
            words=in_words(job.schedule),
            zone=zone_name(job.schedule),
            next=app.next_slots(job.name, now, 3),
            shifts=dst_shifts(job.schedule, now),
            pause=pauses.get(job.name),
            last_slot=latest.at,
            last_outcome=latest.outcome,
            last_sentence=latest.sentence,
            last_label=latest.label,
        )
        for job, latest in zip(jobs, last, strict=True)
    ]
    return page(
        settings,
        request,
        "overview.html",
        granted,
        jobs=rows,
        now=now,
        counts=counts,
        states=STATES,
        cap=COUNT_CAP,
        queues=sorted(queues.items()),
        duplicates=duplicates,
        strip=strip(series, now),
        schedules=schedules[0],
        more_schedules=schedules[1],
    )


def _slots_param(request: Request) -> int:
    raw = request.query_params.get("n", str(DEFAULT_SLOTS))
    try:
        n = int(raw)
    except ValueError:
        raise BadInputError(f"bad n={raw!r}: a number of slots, 1-{timeline.MAX_SLOTS}") from None
    if not 1 <= n <= timeline.MAX_SLOTS:
        raise BadInputError(f"bad n={n}: a number of slots, 1-{timeline.MAX_SLOTS}")
    return n


async def job_context(settings: Settings, request: Request, name: str) -> dict[str, Any]:
    """What the job page shows (also under a backfill's plan)."""
    app = settings.app
    job = app.registry.job(name)
    n = _slots_param(request)
    await app.store.ensure_schema()
    now, pauses = await gather(app.store.database_time(), app.pauses())
    slots = timeline.expected_slots(job, now, n)
    verdict = await app.verify([job.name], since=slots[0] if slots else now, until=now)
    (judged,) = verdict.jobs
    views = await timeline.timeline(app, job, now, n, judged.first_seen)
    pause = pauses.get(job.name)
    return {
        "job": job,
        "words": in_words(job.schedule),
        "zone": zone_name(job.schedule),
        "now": now,
        "n": n,
        "slots": views,
        "marks": timeline.counts(views),
        "verdict": judged,
        "verdict_line": verdict_words(judged),
        "outcomes": timeline.OUTCOMES,
        "next": app.next_slots(job.name, now, NEXT_SLOTS),
        "shifts": dst_shifts(job.schedule, now),
        "pause": pause,
        "latest": views[-1].at if views else None,
        "running": [v for v in views if v.outcome == "running"],
        "plan": None,
        "plan_range": None,
        "confirm_run": None,
    }


async def job_page(settings: Settings, request: Request) -> Response:
    granted = await guard(settings, request)
    if not isinstance(granted, Access):
        return granted
    name = request.path_params["job"]
    try:
        context = await job_context(settings, request, name)
    except UnknownJobError as exc:
        return error(settings, request, 404, str(exc), granted)
    except BadInputError as exc:
        return error(settings, request, 400, str(exc), granted)
    return page(settings, request, "job.html", granted, **context)


def _text(request: Request, name: str) -> str | None:
    value = request.query_params.get(name, "").strip()
    return value or None


def parse_time(value: str | None, what: str) -> datetime | None:
    """An ISO-8601 time from a form; one without an offset is taken as UTC (a browser's
    datetime-local input sends none)."""
    if value is None or not value.strip():
        return None
    return clock.parse_iso(value, what, hint="use ISO 8601, e.g. 2026-11-30T08:00:00Z")


def task_filter(params: Any) -> TaskFilter:
    """A task listing's filter from query or form fields; BadInputError for a bad one."""

    def text(name: str) -> str | None:
        value = str(params.get(name, "") or "").strip()
        return value or None

    state = text("state")
    if state is not None and state not in STATES:
        raise BadInputError(f"bad state {state!r}: one of {', '.join(STATES)}")
    return TaskFilter(
        state=state,
        queue=text("queue"),
        task=text("task"),
        key=text("key"),
        after=parse_time(text("after"), "after"),
        before=parse_time(text("before"), "before"),
    )


def cursor_param(value: str | None) -> int | None:
    if value is None or not value.strip():
        return None
    try:
        cursor = int(value)
    except ValueError:
        raise BadInputError(f"bad cursor {value!r}: a task id") from None
    if cursor < 0:
        raise BadInputError(f"bad cursor {value!r}: a task id")
    return cursor


def shown_args(settings: Settings, rec: TaskRecord) -> object:
    """A task's arguments as the pages show them: through `redact` if the dashboard has one."""
    if settings.redact is None:
        return rec.args
    return settings.redact(rec.task, dict(rec.args))


async def tasks_page_context(
    settings: Settings,
    request: Request,
    where: TaskFilter,
    cursor: int | None = None,
    params: Any = None,
) -> dict[str, Any]:
    """What the task listing shows: one page of the tasks that match `where`."""
    app = settings.app
    names = [t.name for t in app.tasks]
    found = await app.store.views.task_page(where, cursor, PAGE_SIZE, names)
    rows = [(rec, pretty(shown_args(settings, rec))) for rec in found.tasks]
    fields = ("state", "queue", "task", "key", "after", "before")
    given = request.query_params if params is None else params
    query = {k: v for k, v in given.items() if k in fields and isinstance(v, str) and v}
    return {
        "rows": rows,
        "where": where,
        "states": STATES,
        "next_cursor": found.next_cursor,
        "scanned": found.scanned,
        "query": query,
        "bulk": None,
    }


async def tasks_page(settings: Settings, request: Request) -> Response:
    granted = await guard(settings, request)
    if not isinstance(granted, Access):
        return granted
    try:
        where = task_filter(request.query_params)
        cursor = cursor_param(request.query_params.get("cursor"))
    except BadInputError as exc:
        return error(settings, request, 400, str(exc), granted)
    context = await tasks_page_context(settings, request, where, cursor)
    return page(settings, request, "tasks.html", granted, **context)


async def task_page(settings: Settings, request: Request) -> Response:
    granted = await guard(settings, request)
    if not isinstance(granted, Access):
        return granted
    raw = request.path_params["task_id"]
    try:
        task_id = cursor_param(raw)
        assert task_id is not None
        rec, answer, sentence = await settings.app.explain_task(task_id)
    except BadInputError as exc:
        return error(settings, request, 404, str(exc), granted)
    history = await settings.app.store.views.task_errors(task_id)
    return page(
        settings,
        request,
        "task.html",
        granted,
        rec=rec,
        args=pretty(shown_args(settings, rec)),
        result=pretty(rec.result),
        answer=answer,
        sentence=sentence,
        history=history,
        task_actions=task_actions(rec, granted),
        error_origin=error_origin(rec.error),
    )


def task_actions(rec: TaskRecord, access: Access) -> list[str]:
    """The actions the task page offers: those allowed that apply to the task's state."""
    return [
        kind
        for kind, states in TASK_ACTIONS.items()
        if rec.state in states and access.may(f"task_{kind}")
    ]


def error_origin(text: str | None) -> str | None:
    """Who wrote a task's error when no failed attempt recorded one: its lease's expiry (the
    worker died), an operator's cancel, its worker's shutdown, or an older schema that kept
    no attempts."""
    if text is None:
        return None
    if text.startswith("LeaseExpired:"):
        return "lease"
    if text.startswith("Cancelled: by "):
        return "cancel"
    if text.startswith("Cancelled:"):
        return "shutdown"
    return "schema"


async def audit_page(settings: Settings, request: Request) -> Response:
    granted = await guard(settings, request)
    if not isinstance(granted, Access):
        return granted
    try:
        before = cursor_param(request.query_params.get("before"))
    except BadInputError as exc:
        return error(settings, request, 400, str(exc), granted)
    job, action, actor = _text(request, "job"), _text(request, "action"), _text(request, "actor")
    try:
        entries = await settings.app.store.views.audit(
            job=job, action=action, actor=actor, before=before, limit=PAGE_SIZE + 1
        )
    except (BadInputError, DatabaseError) as exc:  # a filter the database refuses
        return error(settings, request, 400, str(exc), granted)
    more = entries[PAGE_SIZE - 1].id if len(entries) > PAGE_SIZE else None
    query = {k: v for k, v in request.query_params.items() if k != "before" and v}
    return page(
        settings,
        request,
        "audit.html",
        granted,
        entries=entries[:PAGE_SIZE],
        filters={"job": job or "", "action": action or "", "actor": actor or ""},
        more=more,
        query=query,
    )
