"""Native libraries (TensorFlow and absl on import, the LiteRT converter, XNNPACK on the first invoke) and
ai-edge-quantizer's progress bars write straight to file descriptors 1 and 2, past Python's logging and
`--quiet`: banners like "All log messages before absl::InitializeLog() ..." and "Created TensorFlow Lite XNNPACK
delegate for CPU." landed among edgekit's own progress and results. EDGEKIT_NATIVE_LOG=1 leaves them in place: what
a library wrote before it crashed the process (a signal, not an exception) is lost otherwise."""
import contextlib
import faulthandler
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
    try:
        saved = os.dup(1), os.dup(2)
    except OSError:  # a closed descriptor: nothing to hide into, run as is
        yield
        return
    with tempfile.TemporaryFile("w+", errors="replace") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        failed = False
        try:
            with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log), crash_reported(saved[1]):
                yield
        except BaseException as e:
            failed = not isinstance(e, (EdgekitError, KeyboardInterrupt))
            raise
        finally:
            log.flush()
            for fd, copy in zip((1, 2), saved):
                os.dup2(copy, fd)
                os.close(copy)
            if failed:
                log.seek(0)
                if (text := log.read().strip()) and sys.stderr is not None:
                    sys.stderr.write(text[-TAIL:] + "\n")


@contextlib.contextmanager
def crash_reported(fd: int):
    """A crash in native code meanwhile (SIGSEGV, SIGABRT: no exception, the process dies) says so on `fd`, the real
    stderr, with Python's traceback (Python's faulthandler), where it said nothing: fd 2 is the hidden log then.
    A faulthandler the host enabled itself is left as it is."""
    if faulthandler.is_enabled():
        yield
        return
    with open(fd, "w", closefd=False) as real:
        faulthandler.enable(real)
        try:
            yield
        finally:
            faulthandler.disable()
