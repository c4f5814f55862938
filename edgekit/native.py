"""Native libraries (TensorFlow and absl on import, the LiteRT converter, XNNPACK on the first invoke) and
ai-edge-quantizer's progress bars write straight to file descriptors 1 and 2, past Python's logging and
`--quiet`: banners like "All log messages before absl::InitializeLog() ..." and "Created TensorFlow Lite XNNPACK
delegate for CPU." landed among edgekit's own progress and results. EDGEKIT_NATIVE_LOG=1 leaves them in place: what
a library wrote before it crashed the process (a signal, not an exception) is lost otherwise."""
import contextlib
import faulthandler
import fcntl
import logging
import os
import sys
import tempfile
import threading

from .errors import EdgekitError

TAIL = 4000  # characters of the hidden output shown when the call fails


LOCK = threading.RLock()  # fds 1 and 2 and sys.stdout / sys.stderr are the process's: one thread swaps them at a time


@contextlib.contextmanager
def hidden_output():
    """Everything written to stdout and stderr inside the `with`, by Python or native code, is kept aside and
    dropped; if the body fails unexpectedly (not an EdgekitError, which says what is wrong itself, nor Ctrl-C),
    its last `TAIL` characters go to stderr ahead of the traceback, since they may say why. One thread at a time
    (two TFLite loads in two threads left the process with fds 1 and 2 on a deleted file); what the host's other
    threads print meanwhile is dropped too. A root logging handler that code inside adds (logging.info() with no
    handler calls basicConfig, on the stderr of the moment) is taken away again: it wrote to the closed file."""
    if os.environ.get("EDGEKIT_NATIVE_LOG") == "1":
        yield
        return
    with LOCK:
        handlers = list(logging.root.handlers)
        try:
            with _hidden():
                yield
        finally:
            for h in [h for h in logging.root.handlers if h not in handlers]:
                logging.root.removeHandler(h)


@contextlib.contextmanager
def _hidden():
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:  # None where Python started with the descriptor closed (`>&-`)
            stream.flush()
    saved = _copies()
    with tempfile.TemporaryFile("w+", errors="replace") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        failed = False
        try:
            with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log), crash_reported(saved[2]):
                yield
        except BaseException as e:
            failed = not isinstance(e, (EdgekitError, KeyboardInterrupt))
            raise
        finally:
            log.flush()
            for fd, copy in saved.items():
                if copy is None:  # closed before: closed again
                    os.close(fd)
                else:
                    os.dup2(copy, fd)
                    os.close(copy)
            if failed:
                log.seek(0)
                if (text := log.read().strip()) and sys.stderr is not None:
                    sys.stderr.write(text[-TAIL:] + "\n")


def _copies() -> dict:
    """{1: a copy of fd 1, 2: of fd 2}, each at 3 or above, or None where the descriptor is closed; a closed one is
    opened on /dev/null meanwhile. A new descriptor takes the lowest free number: with fd 2 closed (`2>&-`), the
    copy of stdout was fd 2 itself, which the hiding then overwrote (stdout came back on the deleted log and all
    printed after it was lost), and the log would take fd 2 itself."""
    copies = {}
    for fd in (1, 2):
        try:
            copies[fd] = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
        except OSError:
            copies[fd] = None
            null = os.open(os.devnull, os.O_WRONLY)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    return copies


@contextlib.contextmanager
def crash_reported(fd: int):
    """A crash in native code meanwhile (SIGSEGV, SIGABRT: no exception, the process dies) says so on `fd`, the real
    stderr, with Python's traceback (Python's faulthandler), where it said nothing: fd 2 is the hidden log then.
    A faulthandler the host enabled itself is left as it is."""
    if faulthandler.is_enabled() or fd is None:  # the host's own; or stderr was closed: nowhere to say it
        yield
        return
    with open(fd, "w", closefd=False) as real:
        faulthandler.enable(real)
        try:
            yield
        finally:
            faulthandler.disable()
