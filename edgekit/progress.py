"""Progress bars on stderr, for the command and the library alike: redrawn in place on a terminal; in a log (CI, a
file, a pipe) one whole line every LOG_S seconds and one at the end, never a carriage-return redraw (a log viewer
shows those as ^M, and a warning printed meanwhile landed on the bar's line). TQDM_MININTERVAL and TQDM_MAXINTERVAL
set by the user are kept."""
import os
import shutil
import sys

from tqdm import tqdm

LOG_S = 30.0  # seconds between a bar's lines in a log: 10 redraws a second made ~27k lines in a 45-minute run


def terminal(stream=None) -> bool:
    """Whether `stream` (stderr) is a terminal (not when it is closed: `2>&-`, or a wrapper closed it)."""
    try:
        return (stream or sys.stderr).isatty()
    except (AttributeError, OSError, ValueError):
        return False


class Lines:
    """A log as a bar's file: each redraw a line of its own; the padding and clearing writes are dropped."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> None:
        if line := text.replace("\r", "").rstrip():
            self.stream.write(line + "\n")

    def flush(self) -> None:
        self.stream.flush()


def seconds(name: str, default: float) -> float:
    try:
        return float(os.environ[name])
    except (KeyError, ValueError):
        return default


def bar(iterable=None, **settings) -> tqdm:
    """tqdm(iterable, **settings) on stderr, as the module docstring says."""
    if terminal():  # a pseudo-terminal of 0 columns (some CI containers) drew every bar as an empty line
        return tqdm(iterable, dynamic_ncols=shutil.get_terminal_size((0, 0)).columns > 0, **settings)
    every = seconds("TQDM_MININTERVAL", LOG_S)
    return tqdm(iterable, file=Lines(sys.stderr), mininterval=every,
                maxinterval=seconds("TQDM_MAXINTERVAL", every), **settings)
