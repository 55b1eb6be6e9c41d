"""Finding the user's app: `--app module:attr`, imported with the working directory on sys.path."""

from __future__ import annotations

import importlib
import os
import sys

from ..app import Oncely
from ..errors import BadInputError


def load_app(spec: str | None) -> Oncely:
    """The Oncely instance named by `module:attr` (attr defaults to `app`), or an empty app."""
    if not spec:
        return Oncely()
    module_name, _, attr = spec.partition(":")
    attr = attr or "app"
    if not module_name:
        raise BadInputError(f"bad --app {spec!r}: use MODULE:ATTR, e.g. myproject.jobs:app")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise BadInputError(
                f"bad --app {spec!r}: no module named {exc.name!r} "
                f"(looked in {cwd} and the installed packages)"
            ) from exc
        raise
    app = getattr(module, attr, None)
    if app is None:
        raise BadInputError(f"bad --app {spec!r}: module {module_name!r} has no {attr!r}")
    if not isinstance(app, Oncely):
        raise BadInputError(
            f"bad --app {spec!r}: {module_name}.{attr} is a {type(app).__name__}, not an Oncely app"
        )
    return app
