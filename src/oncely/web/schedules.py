"""The dashboard's data schedules (`app.schedules`): the list, a schedule's page, and its
actions: add, edit, pause, resume, remove (after a confirmation) and run its due slot now.

Each change calls one `app.schedules` method with the resolver's actor, which writes the
audit row; the page adds no other way of changing a schedule. Bad input shows the form
again, filled in as it was sent, with the one-line error at the top of the page (focused,
`role=alert`, a link down to the form), and changes nothing; the list page stays on the
page of schedules it was on."""

from __future__ import annotations

import json
import urllib.parse
from datetime import datetime
from typing import Any

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from ..errors import BadInputError, UnknownScheduleError
from ..model import RunResult, ScheduleRecord, duration_text
from ..registry import Job
from ..schedules import describe
from . import timeline
from .access import Access
from .actions import Handler
from .pages import guard
from .render import Settings, error, gather, page, redirect
from .schedule_rows import job_of, rows, target_of

LIST_PAGE = 100
"""Schedules one list page shows (by name; `?after=NAME` continues)."""
TIMELINE_SLOTS = 24
"""Expected slots a schedule's page shows (`?n=` up to timeline.MAX_SLOTS)."""
NEXT_SLOTS = 5
CATCH_UP = ("latest", "all", "none")
OVERLAP = ("skip", "allow")
EDITED = ("cron", "every", "tz", "target", "args", "catch_up", "grace", "overlap", "timeout")
"""The form fields of a schedule (the name, and `paused`, only when it is added)."""


# -- reading -----------------------------------------------------------------------------


def values_of(record: ScheduleRecord | None) -> dict[str, str]:
    """A schedule's form fields, as text (empty ones for a new schedule)."""
    if record is None:
        return {"tz": "UTC", "args": "{}", "catch_up": "latest", "overlap": "skip"}
    return {
        "name": record.name,
        "cron": record.cron or "",
        "every": duration_text(record.every or 0) if record.cron is None else "",
        "tz": record.tz,
        "target": target_of(record),
        "args": json.dumps(record.args, sort_keys=True, ensure_ascii=False),
        "catch_up": record.catch_up,
        "grace": "" if record.grace is None else duration_text(record.grace),
        "overlap": record.overlap,
        "timeout": "" if record.timeout is None else duration_text(record.timeout),
        "version": str(record.version),
    }


def targets(settings: Settings) -> list[tuple[str, str]]:
    """What a schedule may run: each registered task, then each code job (value, label)."""
    app = settings.app
    found = [(f"task:{t.name}", f"task {t.name}") for t in app.tasks]
    found += [(f"job:{j.name}", f"job {j.name}") for j in app.registry]
    return found


async def list_context(
    settings: Settings, request: Request, values: dict[str, str] | None = None
) -> dict[str, Any]:
    """What the list page shows: one page of schedules by name, and the form to add one."""
    app = settings.app
    await app.store.ensure_schema()
    after = request.query_params.get("after") or None
    now, shown = await gather(
        app.store.database_time(), app.schedules.list(after=after, limit=LIST_PAGE + 1)
    )
    more = shown[LIST_PAGE - 1].name if len(shown) > LIST_PAGE else None
    return {
        "rows": await rows(settings, shown[:LIST_PAGE], now),
        "after": after,
        "page_size": LIST_PAGE,
        "more": more,
        "now": now,
        "values": values if values is not None else values_of(None),
        "targets": targets(settings),
        "catch_ups": CATCH_UP,
        "overlaps": OVERLAP,
        "form_error": None,
        "form_id": "add-form",
    }


async def schedules_page(settings: Settings, request: Request) -> Response:
    granted = await guard(settings, request)
    if not isinstance(granted, Access):
        return granted
    context = await list_context(settings, request)
    return page(settings, request, "schedules.html", granted, **context)


def _slots_param(request: Request) -> int:
    raw = request.query_params.get("n", str(TIMELINE_SLOTS))
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if not 1 <= n <= timeline.MAX_SLOTS:
        raise BadInputError(f"bad n={raw!r}: a number of slots, 1-{timeline.MAX_SLOTS}")
    return n


async def schedule_context(
    settings: Settings, request: Request, name: str, values: dict[str, str] | None = None
) -> dict[str, Any]:
    """What a schedule's page shows: the schedule, its actions, its form, its last slots."""
    app = settings.app
    n = _slots_param(request)
    await app.store.ensure_schema()
    now, record = await gather(app.store.database_time(), app.schedules.get(name))
    job = job_of(record)
    views = await timeline.timeline(app, job, now, n, record.created_at)
    views = [v for v in views if v.outcome != "before_job"]  # not a slot of this schedule
    (row,) = await rows(settings, [record], now)
    return {
        "record": record,
        "row": row,
        "target": target_of(record),
        "ledger": record.ledger_name,
        "now": now,
        "n": n,
        "slots": views,
        "marks": timeline.counts(views),
        "outcomes": timeline.OUTCOMES,
        "next": _next_slots(job, now),
        "values": values if values is not None else values_of(record),
        "targets": targets(settings),
        "catch_ups": CATCH_UP,
        "overlaps": OVERLAP,
        "form_error": None,
        "form_id": "edit-form",
        "confirm_remove": False,
    }


def _next_slots(job: Job, now: datetime) -> list[datetime]:
    found = []
    for at in job.schedule.slots_after(now):
        found.append(at)
        if len(found) == NEXT_SLOTS:
            break
    return found


async def schedule_page(settings: Settings, request: Request) -> Response:
    granted = await guard(settings, request)
    if not isinstance(granted, Access):
        return granted
    name = request.path_params["name"]
    try:
        context = await schedule_context(settings, request, name)
    except UnknownScheduleError as exc:
        return error(settings, request, 404, str(exc), granted)
    except BadInputError as exc:
        return error(settings, request, 400, str(exc), granted)
    return page(settings, request, "schedule.html", granted, **context)


async def ledger_page(settings: Settings, request: Request) -> Response:
    """`/jobs/schedule:NAME`, the job page of a schedule's ledger name: its schedule's page."""
    granted = await guard(settings, request)
    if not isinstance(granted, Access):
        return granted
    name = request.path_params["name"]
    query = f"?{request.url.query}" if request.url.query else ""
    base = str(request.scope.get("root_path", "")).rstrip("/")
    to = urllib.parse.quote(name, safe="")
    return RedirectResponse(f"{base}/schedules/{to}{query}", status_code=307)


# -- the form ----------------------------------------------------------------------------


def _text(form: FormData, name: str) -> str | None:
    value = form.get(name)
    if not isinstance(value, str) or not value.strip():
        return None
    return value.strip()


def sent(form: FormData) -> dict[str, str]:
    """The form's fields as sent (to show them again under an error)."""
    return {k: v for k, v in form.items() if isinstance(v, str) and k != "csrf"}


def _duration(form: FormData, name: str) -> float | str | None:
    """A duration field: a bare number is seconds; `30s`, `5m`, `1h` go to the API as they
    are (which says what is wrong with a bad one); empty: none."""
    raw = _text(form, name)
    if raw is None:
        return None
    try:
        return float(raw)
    except ValueError:
        return raw


def _args(form: FormData) -> dict[str, Any]:
    raw = _text(form, "args") or "{}"
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise BadInputError(f"bad args: not JSON ({exc.msg} at {exc.pos})") from None
    if not isinstance(value, dict):
        raise BadInputError(f"bad args {raw!r}: a JSON object of keyword arguments, like {{}}")
    return value


def _choice(form: FormData, name: str, choices: tuple[str, ...]) -> str:
    value = _text(form, name) or choices[0]
    if value not in choices:
        raise BadInputError(f"bad {name} {value!r}: one of {', '.join(choices)}")
    return value


def fields(form: FormData) -> dict[str, Any]:
    """The keyword arguments of `app.schedules.add` / `update` that the form gives."""
    expression, interval = _text(form, "cron"), _text(form, "every")
    if expression is None and interval is None:
        raise BadInputError("a schedule needs a cron expression or an interval (every 15m)")
    if expression is not None and interval is not None:
        raise BadInputError("a schedule has a cron expression or an interval, not both")
    kind, _, target = (_text(form, "target") or "").partition(":")
    if kind not in ("task", "job") or not target:
        raise BadInputError("bad target: choose a registered task or job")
    return {
        "cron": expression,
        "every": _duration(form, "every"),
        "tz": _text(form, "tz") or "UTC",
        kind: target,
        "args": _args(form),
        "catch_up": _choice(form, "catch_up", CATCH_UP),
        "grace": _duration(form, "grace"),
        "overlap": _choice(form, "overlap", OVERLAP),
        "timeout": _duration(form, "timeout"),
    }


# -- the actions -------------------------------------------------------------------------


def _name(request: Request) -> str:
    return str(request.path_params["name"])


async def _unknown(
    settings: Settings, request: Request, access: Access, exc: UnknownScheduleError
) -> Response:
    return error(settings, request, 404, f"{exc}: nothing changed", access)


async def add(settings: Settings, request: Request, access: Access, form: FormData) -> Response:
    """Add a schedule; bad input: the list page again, the form as sent, its error."""
    app = settings.app
    try:
        name = _text(form, "name")
        if name is None:
            raise BadInputError("a schedule needs a name")
        record = await app.schedules.add(
            name, paused=_text(form, "paused") == "1", by=access.actor, **fields(form)
        )
    except BadInputError as exc:
        context = await list_context(settings, request, sent(form))
        context["form_error"] = unchanged(exc)
        return page(settings, request, "schedules.html", access, status=400, **context)
    return redirect(request, f"/schedules/{record.name}", _added(record))


def unchanged(exc: Exception) -> str:
    """A refusal's one line, saying that nothing changed (once)."""
    text = " ".join(str(exc).split())
    return text if "nothing changed" in text else f"{text} (nothing changed)"


def _added(record: ScheduleRecord) -> str:
    nxt = record.next_slot.isoformat() if record.next_slot is not None else "none"
    state = " (paused)" if record.state == "paused" else ""
    return f"added {record.name}{state}: {describe(record)}, next slot {nxt}"


async def edit(settings: Settings, request: Request, access: Access, form: FormData) -> Response:
    """Change a schedule to the form's fields (the API changes those that differ, and
    writes nothing when none does); refused when the schedule changed since the form was
    loaded (its version)."""
    app = settings.app
    name = _name(request)
    try:
        record = await app.schedules.get(name)
    except UnknownScheduleError as exc:
        return await _unknown(settings, request, access, exc)
    try:
        loaded = _text(form, "version")
        version = int(loaded) if loaded is not None and loaded.isdigit() else None
        if loaded is not None and version is None:
            raise BadInputError(f"bad version {loaded!r}: the number the form was loaded at")
        before = values_of(record)
        record = await app.schedules.update(name, version=version, by=access.actor, **fields(form))
    except BadInputError as exc:
        context = await schedule_context(settings, request, name, sent(form))
        context["form_error"] = unchanged(exc)
        return page(settings, request, "schedule.html", access, status=400, **context)
    after = values_of(record)
    changed = ", ".join(k for k in EDITED if before.get(k) != after.get(k))
    if not changed:
        return redirect(request, f"/schedules/{name}", f"{name}: nothing to change")
    return redirect(
        request, f"/schedules/{name}", f"changed {name} ({changed}): {describe(record)}"
    )


async def pause(settings: Settings, request: Request, access: Access, form: FormData) -> Response:
    name = _name(request)
    try:
        await settings.app.schedules.pause(name, reason=_text(form, "reason"), by=access.actor)
    except UnknownScheduleError as exc:
        return await _unknown(settings, request, access, exc)
    return redirect(request, f"/schedules/{name}", f"paused {name} (by {access.actor})")


async def resume(settings: Settings, request: Request, access: Access, form: FormData) -> Response:
    name = _name(request)
    try:
        record = await settings.app.schedules.resume(name, by=access.actor)
    except UnknownScheduleError as exc:
        return await _unknown(settings, request, access, exc)
    nxt = record.next_slot.isoformat() if record.next_slot is not None else "none"
    return redirect(request, f"/schedules/{name}", f"resumed {name}: next slot {nxt}")


async def remove(settings: Settings, request: Request, access: Access, form: FormData) -> Response:
    """Without `confirm=1`: the schedule's page asking to confirm (nothing changes)."""
    name = _name(request)
    try:
        if _text(form, "confirm") != "1":
            context = await schedule_context(settings, request, name)
            context["confirm_remove"] = True
            return page(settings, request, "schedule.html", access, **context)
        await settings.app.schedules.remove(name, by=access.actor)
    except UnknownScheduleError as exc:
        return await _unknown(settings, request, access, exc)
    return redirect(request, "/schedules", f"removed {name}")


async def run_due(settings: Settings, request: Request, access: Access, form: FormData) -> Response:
    """Run the schedule's latest due slot now, through its claim: once."""
    name = _name(request)
    try:
        result = await settings.app.schedules.run_due(name, by=access.actor)
    except UnknownScheduleError as exc:
        return await _unknown(settings, request, access, exc)
    return redirect(request, f"/schedules/{name}", ran(name, result))


def ran(name: str, result: RunResult) -> str:
    """What running a schedule's due slot did, in words."""
    slot = result.slot.isoformat() if result.slot is not None else result.key
    text = f"run {name} slot {slot}: {result.status.value}"
    if result.claim is not None and result.status.value == "skipped":
        text += f" (already ran: by {result.claim.claimed_by} at {result.claim.claimed_at})"
    elif result.error is not None:
        text += f" ({type(result.error).__name__}: {result.error})"
    return text


HANDLERS: dict[str, Handler] = {
    "pause": pause,
    "resume": resume,
    "remove": remove,
    "run": run_due,
    "edit": edit,
}
"""A schedule's actions by the last part of their URL (`/schedules/{name}/pause`)."""
