"""Progress of long CLI steps (demo build, convert, model load, graph capture) on stderr.

A terminal gets a live rich bar that disappears when the step ends; anything else (a pipe, a log
file, CI) gets a few whole lines and never a carriage return or colour code. The steps themselves
report through plain `(detail, done, total)` callbacks, so library code never imports rich.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from types import TracebackType

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

PLAIN_INTERVAL_S = 5.0  # at most one plain progress line per interval (plus start and end)

Emit = Callable[[str], None]


def stderr_line(text: str) -> None:
    """One persistent plain line on stderr (the default sink when stderr is not a terminal)."""
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover - the loop returns at GiB


class StepProgress:
    """One long step: `update()` as work completes, `done()` with a closing line.

    Use as a context manager; leaving it by an exception removes the bar and prints nothing, so
    the error line the CLI prints next stays the only line about the failure.
    """

    def __init__(
        self,
        label: str,
        *,
        unit: str = "",
        emit: Emit | None = None,
        console: Console | None = None,
        interactive: bool | None = None,
        interval_s: float = PLAIN_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label = label
        self.unit = unit  # "bytes" shows sizes; anything else is a count of that unit
        self.console = console or Console(stderr=True, highlight=False)
        self.interactive = (
            self.console.is_terminal and not self.console.is_dumb_terminal
            if interactive is None
            else interactive
        )
        self.emit = emit or stderr_line
        self.interval_s = interval_s
        self.clock = clock
        self.started = clock()
        self._last_line = self.started
        self._bar: Progress | None = None
        self._task = None
        self._closed = False
        self._announced = False

    # -- lifecycle ----------------------------------------------------------------------------
    def __enter__(self) -> StepProgress:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.done()
        else:
            self.close()

    def start(self) -> None:
        self.started = self._last_line = self.clock()
        if self.interactive:
            self._bar = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}", markup=False),
                BarColumn(),
                TextColumn("{task.fields[amount]}"),
                TimeElapsedColumn(),
                TextColumn("[dim]{task.fields[detail]}"),
                console=self.console,
                transient=True,
            )
            self._task = self._bar.add_task(self.label, total=None, amount="", detail="")
            self._bar.start()
        # a plain start line waits for the first report, so a step that fails while checking its
        # input leaves only the error line
        self._announced = False

    def close(self) -> None:
        """Stop without a closing line (the step failed or its owner reports the outcome)."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        self._closed = True

    def done(self, summary: str | None = None) -> None:
        """Stop and print one persistent closing line (default: the label and the time taken)."""
        if self._closed:
            return
        self.close()
        line = summary or f"{self.label}: done in {self.elapsed():.1f}s"
        if self.interactive:
            self.console.print(line, markup=False, highlight=False)
        else:
            self.emit(line)

    def elapsed(self) -> float:
        return self.clock() - self.started

    # -- reporting ----------------------------------------------------------------------------
    def amount(self, done: int, total: int | None) -> str:
        if self.unit == "bytes":
            return f"{_size(done)} of {_size(total)}" if total else _size(done)
        unit = f" {self.unit}" if self.unit else ""
        return f"{done}/{total}{unit}" if total else f"{done}{unit}"

    def update(self, done: int, total: int | None = None, detail: str = "") -> None:
        """Record progress: `done` of `total` units (None: unknown); `detail` names the item."""
        if self._closed:
            return
        if self._bar is not None and self._task is not None:
            self._bar.update(
                self._task,
                completed=done,
                total=total,
                amount=f"{100 * done / total:3.0f}% {self.amount(done, total)}"
                if total
                else self.amount(done, total),
                detail=escape(detail),
            )
            return
        now = self.clock()
        if not self._announced:
            self._announce()
        elif now - self._last_line >= self.interval_s:
            self._last_line = now
            share = f" ({100 * done / total:.0f}%)" if total else ""
            self.emit(f"{self.label}: {self.amount(done, total)}{share}")

    def _announce(self) -> None:
        self._announced = True
        self._last_line = self.clock()
        self.emit(f"{self.label} ...")

    def phase(self, label: str) -> None:
        """Go on with a new stage of the same step whose size is not known (a spinner)."""
        if self._closed:
            return
        self.label = label
        if self._bar is not None and self._task is not None:
            self._bar.update(
                self._task, total=None, completed=0, description=label, amount="", detail=""
            )
        else:
            self._announce()

    def callback(self) -> Callable[[str, int, int], None]:
        """An `(item, done, total)` callback for library code (convert, Artifact.load)."""

        def report(item: str, done: int, total: int) -> None:
            self.update(done, total, item)

        return report
