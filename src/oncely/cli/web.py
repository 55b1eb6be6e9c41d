"""`oncely web`: serve the dashboard (read-only unless `--allow-actions` and a token)."""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import AsyncIterator

import click

from ..masking import mask_secrets
from .common import Context, fail, handled

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8420


LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


def allowed_hosts(host: str, extra: tuple[str, ...]) -> list[str]:
    """The `Host` header values the server answers: the bound address (and, for a loopback
    one, every name of loopback), plus those given; any other is refused with 400, so a
    page that rebinds its own DNS name to this address reads nothing."""
    hosts = [_literal(host), *(_literal(h) for h in extra)]
    if _loopback(host):
        hosts.extend(LOOPBACK_NAMES)
    elif _every_address(host):  # the machine's names too
        hosts.extend([socket.gethostname(), socket.getfqdn(), *LOOPBACK_NAMES])
    return sorted({h.lower() for h in hosts})


def _every_address(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return False


def _literal(host: str) -> str:
    """A host as a Host header spells it: an IPv6 address in brackets."""
    bare = host.strip("[]")
    return f"[{bare}]" if ":" in bare else bare


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
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
@click.option(
    "--allowed-host",
    "allowed",
    multiple=True,
    metavar="NAME",
    help="Another name the dashboard answers to (its `Host` header), e.g. the DNS name a "
    "proxy forwards; repeatable. Default: the --host address (and localhost forms for a "
    "loopback one); any other Host is refused (400).",
)
@click.pass_obj
@handled
def web(
    obj: Context,
    host: str,
    port: int,
    allow_actions: bool,
    token: str | None,
    allowed: tuple[str, ...],
) -> None:
    """Serve the browser dashboard: jobs, slots, tasks, the audit trail (needs `oncely[web]`)."""
    token = token or None
    if allow_actions and token is None:
        fail("--allow-actions needs a token (--token or $ONCELY_WEB_TOKEN): nothing started")
    try:
        import uvicorn
        from starlette.applications import Starlette
        from starlette.middleware import Middleware
        from starlette.middleware.trustedhost import TrustedHostMiddleware
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
    hosts = allowed_hosts(host, allowed)
    server = Starlette(
        routes=[Mount("/", app=board)],
        lifespan=lifespan,
        middleware=[Middleware(TrustedHostMiddleware, allowed_hosts=hosts, www_redirect=False)],
    )
    mode = "actions allowed with the token" if allow_actions else "read-only"
    if not _loopback(host):
        click.echo(f"warning: listening on {host}, beyond this machine", err=True)
    click.echo(
        f"oncely web on http://{host}:{port}/ ({mode}; {mask_secrets(app.store.display_url)})",
        err=True,
    )
    uvicorn.run(server, host=host, port=port, log_level="warning", access_log=False)
