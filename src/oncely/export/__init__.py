"""Writing the registry's schedules as an external scheduler's configuration.

One module per target (eventbridge, kubernetes, crontab, systemd); `base` holds what they
share. Each either writes a schedule that fires at exactly oncely's slots (warning where only
the target's DST rules differ) or refuses with UnsupportedScheduleError.
"""

from __future__ import annotations

from .base import Export, UnsupportedScheduleError

__all__ = ["Export", "UnsupportedScheduleError"]
