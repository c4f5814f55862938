"""Native libraries (TensorFlow and absl on import, the LiteRT converter, XNNPACK on the first invoke) and
ai-edge-quantizer's progress bars write straight to file descriptors 1 and 2, past Python's logging and
`--quiet`: banners like "All log messages before absl::InitializeLog() ..." and "Created TensorFlow Lite XNNPACK
delegate for CPU." landed among edgekit's own progress and results."""
import contextlib
import os
import sys
import tempfile

from .errors import EdgekitError

TAIL = 4000  # characters of the hidden output shown when the call fails


@contextlib.contextmanager
def hidden_output():
    """Everything written to stdout and stderr inside the `with`, by Python or native code, is kept aside and
    dropped; if the body fails unexpectedly (not an EdgekitError, which says what is wrong itself, nor Ctrl-C),
    its last `TAIL` characters go to stderr ahead of the traceback, since they may say why."""
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
            with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):  # where sys.stdout is no fd 1
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
