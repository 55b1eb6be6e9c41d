"""`oncely web`: serve the dashboard (read-only unless `--allow-actions` and a token)."""

from __future__ import annotations

import contextlib
import ipaddress
from collections.abc import AsyncIterator

import click

from ..masking import mask_secrets
from . import Context, fail, handled

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8420


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@click.command("web")
@click.option("--host", default=DEFAULT_HOST, show_default=True, help="Address to listen on.")
@click.option(
    "--port", default=DEFAULT_PORT, show_default=True, type=click.IntRange(0, 65535), help="Port."
)
@click.option(
    "--allow-actions",
    is_flag=True,
    help="Let a request that presents the token pause, resume, backfill, release, cancel and "
    "retry (each audited). Without it the dashboard is read-only.",
)
@click.option(
    "--token",
    envvar="ONCELY_WEB_TOKEN",
    metavar="TOKEN",
    help="The secret that allows actions (with --allow-actions): `Authorization: Bearer "
    "TOKEN`, or the login form [env ONCELY_WEB_TOKEN].",
)
@click.pass_obj
@handled
def web(obj: Context, host: str, port: int, allow_actions: bool, token: str | None) -> None:
    """Serve the browser dashboard: jobs, slots, tasks, the audit trail (needs `oncely[web]`)."""
    token = token or None
    if allow_actions and token is None:
        fail("--allow-actions needs a token (--token or $ONCELY_WEB_TOKEN): nothing started")
    try:
        import uvicorn
        from starlette.applications import Starlette
        from starlette.routing import Mount

        from ..web import dashboard
    except ImportError as exc:
        fail(
            "the dashboard needs oncely's `web` extra (Starlette, Jinja2, python-multipart,"
            f" uvicorn), e.g. in a clone of oncely: pip install -e '.[web]' ({exc})"
        )
    app = obj.app
    if token is not None and not allow_actions:
        click.echo("note: --token without --allow-actions: the dashboard is read-only", err=True)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        yield
        await app.aclose()

    board = dashboard(app, token=token if allow_actions else None)
    server = Starlette(routes=[Mount("/", app=board)], lifespan=lifespan)
    mode = "actions allowed with the token" if allow_actions else "read-only"
    if not _loopback(host):
        click.echo(f"warning: listening on {host}, beyond this machine", err=True)
    click.echo(
        f"oncely web on http://{host}:{port}/ ({mode}; {mask_secrets(app.store.display_url)})",
        err=True,
    )
    uvicorn.run(server, host=host, port=port, log_level="warning", access_log=False)
