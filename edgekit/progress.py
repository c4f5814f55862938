"""Progress bars on stderr, for the command and the library alike: redrawn in place on a terminal (or in a notebook);
in a log (CI, a file, a pipe) one whole line every LOG_S seconds and one at the end, never a carriage-return or
cursor-moving redraw (a log viewer shows those as ^M and ^[[A, and a warning printed meanwhile landed on the bar's
line), and no stale line: with miniters 1, tqdm's monitor thread never redraws a bar that slowed down with its last
count and rate just before the next line. TQDM_MININTERVAL and TQDM_MAXINTERVAL set by the user are kept; settings a
caller gives win."""
import os
import re
import sys

from tqdm import tqdm

LOG_S = 30.0  # seconds between a bar's lines in a log: 10 redraws a second made ~27k lines in a 45-minute run
ESCAPES = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # tqdm moves the cursor up and down around nested bars


def terminal(stream) -> bool:
    """Whether `stream` is a terminal (not when it is None or closed: `2>&-`, or a wrapper closed it)."""
    try:
        return stream.isatty()
    except (AttributeError, OSError, ValueError):
        return False


def live() -> bool:
    """Whether a bar redraws in place: stderr is a terminal, or a notebook's (ipykernel's stream says no tty, and
    renders carriage returns)."""
    return terminal(sys.stderr) or "ipykernel" in sys.modules


class Lines:
    """A log as a bar's file: each redraw a line of its own; the padding, clearing and cursor moves are dropped."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> None:
        if line := ESCAPES.sub("", text.replace("\r", "")).rstrip():
            self.stream.write(line + "\n")

    def flush(self) -> None:
        self.stream.flush()


def seconds(name: str, default: float) -> float:
    try:
        return float(os.environ[name])
    except (KeyError, ValueError):
        return default


def has_width() -> bool:
    """Whether stderr's terminal has a width (a pseudo-terminal of 0 columns, as some CI containers have, drew every
    bar as an empty line)."""
    try:
        return os.get_terminal_size(sys.stderr.fileno()).columns > 0
    except (AttributeError, OSError, ValueError):
        return False


def bar(iterable=None, **settings) -> tqdm:
    """tqdm(iterable, **settings) on stderr, as the module docstring says."""
    if live():
        return tqdm(iterable, **{"dynamic_ncols": has_width(), **settings})
    if sys.stderr is None:  # started with stderr closed: nowhere to draw
        return tqdm(iterable, **{**settings, "disable": True})
    every = seconds("TQDM_MININTERVAL", LOG_S)
    settings["file"] = Lines(settings.get("file") or sys.stderr)
    return tqdm(iterable, **{"mininterval": every, "maxinterval": seconds("TQDM_MAXINTERVAL", every), "miniters": 1,
                             **settings})
