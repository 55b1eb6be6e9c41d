"""The dashboard's actions (POST): each checks the permission and the CSRF token, then calls
one public `Oncely` method with the resolver's actor, which writes the audit row. The page
adds no other way of changing state. Refused: 403 (not allowed, no CSRF token), 404 (no
such job or task), 400 (bad input; the API's refusals too), each with nothing changed."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response

from ..errors import BadInputError, OncelyError, UnknownJobError
from ..model import RunResult, RunStatus
from ..store import TaskFilter
from .access import Access
from .pages import (
    cursor_param,
    guard,
    job_context,
    parse_time,
    task_filter,
    tasks_page_context,
)
from .render import Settings, error, forged, page, redirect
from .words import ran_before, slot_words

BULK_MAX = 1000
"""The most tasks one bulk action changes (the confirmation says how many match)."""
BULK_SCAN = 40
"""Pages of a bulk action's walk over the tasks, at most (each bounded by the listing's
window): a filter no index holds looks at 200,000 tasks at most."""
BULK_PAGE = 500
BULK_ACTIONS = {"retry": "task_retry", "discard": "task_discard", "cancel": "task_cancel"}

Handler = Callable[[Settings, Request, Access, FormData], Awaitable[Response]]


def action(
    name: str | None, handler: Handler
) -> Callable[[Settings, Request], Awaitable[Response]]:
    """A POST endpoint: access, permission for `name` (None: decided by the handler from
    the form), same origin and the session's CSRF token; then the handler. An OncelyError
    becomes an error page."""

    async def endpoint(settings: Settings, request: Request) -> Response:
        granted = await guard(settings, request)
        if not isinstance(granted, Access):
            return granted
        form = await request.form()
        try:
            if name is not None and not granted.may(name):
                return error(settings, request, 403, _not_allowed(name), granted)
            refused = forged(settings, request, form)
            if refused is not None:
                return error(settings, request, 403, refused, granted)
            return await handler(settings, request, granted, form)
        except UnknownJobError as exc:
            return error(settings, request, 404, f"{exc}: nothing changed", granted)
        except OncelyError as exc:
            return error(settings, request, 400, str(exc), granted)
        finally:
            await form.close()

    return endpoint


def _not_allowed(name: str) -> str:
    return (
        f"not allowed: this dashboard does not let you {name.replace('_', ' ')} (nothing changed)"
    )


def _field(form: FormData, name: str) -> str | None:
    value = form.get(name)
    if not isinstance(value, str) or not value.strip():
        return None
    return value.strip()


def _reason(form: FormData) -> str | None:
    return _field(form, "reason")


# -- jobs -------------------------------------------------------------------------------


async def pause(settings: Settings, request: Request, access: Access, form: FormData) -> Response:
    name = request.path_params["job"]
    done = await settings.app.pause(name, reason=_reason(form), actor=access.actor)
    return redirect(request, f"/jobs/{name}", f"paused {name} (by {done.paused_by})")


async def resume(settings: Settings, request: Request, access: Access, form: FormData) -> Response:
    name = request.path_params["job"]
    await settings.app.resume(name, reason=_reason(form), actor=access.actor)
    return redirect(request, f"/jobs/{name}", f"resumed {name}")


def _ran(results: list[RunResult]) -> str:
    counts: dict[str, int] = {}
    for r in results:
        counts[r.status.value] = counts.get(r.status.value, 0) + 1
    return ", ".join(f"{k} {n}" for k, n in sorted(counts.items())) or "nothing to run"


async def run(settings: Settings, request: Request, access: Access, form: FormData) -> Response:
    """Run one slot now (default: the latest due one), as a one-slot backfill: its claim,
    its transaction, its audit row (action `run_slot`); a slot that ran before is not run
    again, and one not due yet is refused (the form's `allow_future=1` runs it on purpose,
    audited). A slot that ran and was released asks first (it would run a second time);
    `confirm=1` runs it."""
    app = settings.app
    name = request.path_params["job"]
    job = app.registry.job(name)
    at = parse_time(_field(form, "slot"), "slot")
    if at is None:
        at = app.slot(name, await app.store.database_time()).at
    slot = app.slot(name, at)
    if slot.at != at:
        raise BadInputError(
            f"bad slot {at.isoformat()}: {name} has no slot then (the one before is "
            f"{slot.at.isoformat()}): nothing ran"
        )
    if _field(form, "confirm") != "1":
        asked = await _confirm_second_run(settings, request, access, name, at)
        if asked is not None:
            return asked
    results = await app.backfill(
        job.name,
        at,
        at + timedelta(microseconds=1),
        actor=access.actor,
        reason=_reason(form),
        allow_future=_field(form, "allow_future") == "1",
        audit_as="run_slot",
    )
    failed = [r for r in results if r.status in (RunStatus.FAILED, RunStatus.TIMEOUT)]
    text = f"run {name} slot {at.isoformat()}: {_ran(results)}"
    if failed and failed[0].error is not None:
        text += f" ({type(failed[0].error).__name__}: {failed[0].error})"
    return redirect(request, f"/jobs/{name}", text)


async def _confirm_second_run(
    settings: Settings, request: Request, access: Access, name: str, at: datetime
) -> Response | None:
    """The job page asking to confirm, when the slot ran once and was released (running it
    now runs its effects a second time); None: the slot never ran, nothing to ask."""
    explanation = await settings.app.explain(name, at)
    if ran_before(explanation) is None:
        return None
    context = await job_context(settings, request, name)
    context["confirm_run"] = {"slot": at, "words": slot_words(explanation)}
    return page(settings, request, "job.html", access, **context)


async def backfill(
    settings: Settings, request: Request, access: Access, form: FormData
) -> Response:
    """Without `apply`: the plan (nothing changes); with `apply=1`: run the free slots."""
    app = settings.app
    name = request.path_params["job"]
    app.registry.job(name)
    start = parse_time(_field(form, "start"), "start")
    end = parse_time(_field(form, "end"), "end")
    if start is None or end is None:
        raise BadInputError("bad range: both start and end are needed: nothing changed")
    allow_future = _field(form, "allow_future") == "1"
    if _field(form, "apply") != "1":
        plan = await app.backfill_plan(name, start, end, allow_future=allow_future)
        context = await job_context(settings, request, name)
        context["plan"] = plan
        context["plan_range"] = {
            "start": _field(form, "start"),
            "end": _field(form, "end"),
            "allow_future": allow_future,
        }
        return page(settings, request, "job.html", access, **context)
    results = await app.backfill(
        name, start, end, actor=access.actor, reason=_reason(form), allow_future=allow_future
    )
    return redirect(request, f"/jobs/{name}", f"backfill {name}: {_ran(results)}")


async def release(settings: Settings, request: Request, access: Access, form: FormData) -> Response:
    app = settings.app
    name = request.path_params["job"]
    app.registry.job(name)
    key = _field(form, "key")
    if key is None:
        raise BadInputError("release needs the slot's key: nothing changed")
    claim, given_up = await app.release_slot(name, key, actor=access.actor, reason=_reason(form))
    if claim is None and not given_up:
        raise BadInputError(f"{name} has no claim with key {key!r}: nothing released")
    return redirect(request, f"/jobs/{name}", f"released {name} {key}: the slot can run again")


async def skip(settings: Settings, request: Request, access: Access, form: FormData) -> Response:
    """Settle a slot that did not run (given up) as skipped on purpose, with a reason."""
    app = settings.app
    name = request.path_params["job"]
    app.registry.job(name)
    key, reason = _field(form, "key"), _reason(form)
    if key is None:
        raise BadInputError("skip needs the slot's key: nothing changed")
    if reason is None:
        raise BadInputError("a skip needs a reason: it is what verify reports (nothing changed)")
    await app.skip_slot(name, key, reason=reason, actor=access.actor)
    return redirect(request, f"/jobs/{name}", f"skipped {name} {key} on purpose: {reason}")


async def cancel(settings: Settings, request: Request, access: Access, form: FormData) -> Response:
    app = settings.app
    name = request.path_params["job"]
    app.registry.job(name)
    at = parse_time(_field(form, "slot"), "slot")
    asked = await app.cancel(name, at, actor=access.actor, reason=_reason(form))
    ids = ", ".join(str(i) for i in asked)
    return redirect(request, f"/jobs/{name}", f"cancel requested for {name} (attempt {ids})")


# -- tasks ------------------------------------------------------------------------------


def _task_id(request: Request) -> int:
    task_id = cursor_param(request.path_params["task_id"])
    assert task_id is not None
    return task_id


async def _known_task(settings: Settings, task_id: int) -> None:
    await settings.app.task_record(task_id)  # BadInputError: no such task


def task_action(kind: str) -> Handler:
    """The handler of one task's action (`retry`, `discard`, `cancel`)."""

    async def handler(
        settings: Settings, request: Request, access: Access, form: FormData
    ) -> Response:
        try:
            task_id = _task_id(request)
            await _known_task(settings, task_id)
        except BadInputError as exc:
            return error(settings, request, 404, f"{exc}: nothing changed", access)
        text = await apply_task(settings, kind, task_id, access.actor, _reason(form))
        return redirect(request, f"/tasks/{task_id}", text)

    return handler


async def apply_task(
    settings: Settings, kind: str, task_id: int, actor: str, reason: str | None
) -> str:
    """One task action through the public API; what it did, in words."""
    app = settings.app
    if kind == "retry":
        rec = await app.retry_task(task_id, actor=actor, reason=reason)
        return f"task {task_id} ({rec.task}) will run again now"
    if kind == "discard":
        rec = await app.discard_task(task_id, actor=actor, reason=reason)
        return f"task {task_id} ({rec.task}) discarded"
    what, _ = await app.cancel_task(task_id, actor=actor, reason=reason)
    return f"task {task_id}: {what}"


async def _matching(
    settings: Settings, where: TaskFilter, upto: int | None, limit: int
) -> tuple[list[int], bool]:
    """The ids of the tasks that match a filter (at or below id `upto`), newest first, at
    most `limit`; and whether there are more."""
    app = settings.app
    names = [t.name for t in app.tasks]
    ids: list[int] = []
    cursor = None if upto is None else upto + 1
    for _ in range(BULK_SCAN):
        found = await app.store.views.task_page(where, cursor, BULK_PAGE, names)
        ids.extend(rec.id for rec in found.tasks)
        if len(ids) > limit:
            return ids[:limit], True
        if found.next_cursor is None:
            return ids, False
        cursor = found.next_cursor
    return ids, True


async def bulk(settings: Settings, request: Request, access: Access, form: FormData) -> Response:
    """A bulk action on the tasks that match a filter: first the count and a confirmation
    (nothing changes), then, with `confirm=1`, each task through the public API."""
    kind = _field(form, "action") or ""
    if kind not in BULK_ACTIONS:
        raise BadInputError(f"bad action {kind!r}: one of {', '.join(BULK_ACTIONS)}")
    if not access.may(BULK_ACTIONS[kind]):
        return error(settings, request, 403, _not_allowed(BULK_ACTIONS[kind]), access)
    where = task_filter(form)
    upto = cursor_param(_field(form, "upto"))
    if _field(form, "confirm") != "1":
        newest = await settings.app.store.views.newest_task_id()
        ids, more = await _matching(settings, where, newest, BULK_MAX)
        info: dict[str, Any] = {
            "action": kind,
            "count": len(ids),
            "more": more,
            "max": BULK_MAX,
            "upto": newest,
            "fields": {k: v for k, v in form.items() if k in _FILTER_FIELDS and v},
        }
        context = await tasks_page_context(settings, request, where, params=form)
        context["bulk"] = info
        return page(settings, request, "tasks.html", access, **context)
    ids, _ = await _matching(settings, where, upto, BULK_MAX)
    done, refused = 0, 0
    for task_id in ids:
        try:
            await apply_task(settings, kind, task_id, access.actor, _reason(form))
            done += 1
        except BadInputError:
            refused += 1
    text = f"{kind}: {done} tasks" + (
        f", {refused} refused (their state changed)" if refused else ""
    )
    return redirect(request, "/tasks", text)


_FILTER_FIELDS = ("state", "queue", "task", "key", "after", "before")
