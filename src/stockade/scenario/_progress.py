"""Showing a scenario's progress: a live table on a terminal, plain lines elsewhere.

On a terminal, a ``rich`` table redrawn in place: one row per run slot (an
agent, or each of its replicas) with its state, run id, exit code, restarts,
denials and a note (why it was skipped, why it failed). Elsewhere (a pipe, a
log, CI), one line per change of a row, so that a log reads as a history and
nothing is redrawn.
"""

from __future__ import annotations

from typing import IO, Any

from stockade.scenario._runner import Scheduler, Unit

_STYLE = {
    "waiting": "dim",
    "starting": "cyan",
    "restarting": "cyan",
    "running": "cyan",
    "succeeded": "green",
    "failed": "bold red",
    "skipped": "yellow",
    "stopped": "magenta",
}
_COLUMNS = ("AGENT", "STATE", "RUN", "EXIT", "RESTARTS", "DENIALS", "NOTE")


def row(unit: Unit) -> tuple[str, ...]:
    """A unit as the cells of its row."""
    # A unit waiting again after a crash is being restarted: say so.
    state = "restarting" if unit.state == "waiting" and unit.restarts else unit.state
    return (
        unit.name,
        state,
        unit.run_id or "-",
        "-" if unit.exit_code is None else str(unit.exit_code),
        str(unit.restarts),
        str(unit.denials),
        unit.note,
    )


class Progress:
    """What ``stockade scenario run`` shows; use as a context manager, call ``update``.

    ``live`` chooses the table (a terminal) or plain lines; ``stream`` is where
    they go (stdout by default).
    """

    def __init__(self, title: str, *, live: bool, stream: IO[str] | None = None) -> None:
        self.title = title
        self._live_wanted = live
        self._stream = stream
        self._shown: dict[str, tuple[str, ...]] = {}
        self._live: Any = None
        self._console: Any = None

    def __enter__(self) -> Progress:
        if self._live_wanted:
            from rich.console import Console
            from rich.live import Live

            self._console = Console(file=self._stream)
            self._live = Live(console=self._console, auto_refresh=False, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)
            self._live = None

    def update(self, scheduler: Scheduler) -> None:
        units = list(scheduler.units.values())
        if self._live is not None:
            self._live.update(self._table(units), refresh=True)
            return
        import sys

        out = self._stream or sys.stdout
        width = max((len(u.name) for u in units), default=5)
        for unit in units:
            cells = row(unit)
            if self._shown.get(unit.name) == cells:
                continue
            self._shown[unit.name] = cells
            line = f"{unit.name:<{width}}  {cells[1]:<10}"
            if unit.run_id:
                line += f"  {unit.run_id}"
            if unit.exit_code is not None:
                line += f"  exit {unit.exit_code}"
            if unit.restarts:
                line += f"  restarts {unit.restarts}"
            if unit.denials:
                line += f"  denials {unit.denials}"
            if unit.note:
                line += f"  ({unit.note})"
            out.write(line.rstrip() + "\n")
        out.flush()

    def _table(self, units: list[Unit]) -> Any:
        from rich.table import Table

        table = Table(title=self.title, title_justify="left", expand=False)
        for column in _COLUMNS:
            table.add_column(column, no_wrap=column != "NOTE", overflow="fold")
        for unit in units:
            cells = list(row(unit))
            style = _STYLE.get(cells[1], "")
            cells[1] = f"[{style}]{cells[1]}[/]" if style else cells[1]
            table.add_row(*cells)
        return table


__all__ = ["Progress", "row"]
