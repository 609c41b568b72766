"""The live dashboard: the record of runs in a browser, live or replayed (docs/DASHBOARD.md).

``attach(daemon)`` lets ``stockade dashboard`` open it in a daemon;
``load_replay`` and ``serve_replay`` serve a bundle or an export without one.
"""

from stockade.dashboard._serve import METHOD, DashboardServer, attach, serve_replay
from stockade.dashboard._source import LiveSource, ReplayError, ReplaySource, Source, load_replay

__all__ = [
    "METHOD",
    "DashboardServer",
    "LiveSource",
    "ReplayError",
    "ReplaySource",
    "Source",
    "attach",
    "load_replay",
    "serve_replay",
]
