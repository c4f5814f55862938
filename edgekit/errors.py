class EdgekitError(Exception):
    """A problem the user can fix; the CLI prints it as one line and exits with `code`."""

    code = 1

    def __init__(self, message: str):
        # user values quoted inside a message may hold line breaks: keep the message one line, faithfully
        super().__init__(message.replace("\r", "\\r").replace("\n", "\\n"))


class UsageError(EdgekitError):
    """A wrong command line or recipe: exit code 2."""

    code = 2


class Terminated(KeyboardInterrupt):
    """SIGTERM (CI cancelling a job, docker stop, systemd) ends a run as Ctrl-C does: temp files go, the message says
    what resumes, exit 143."""


STOP = {"at": None, "signal": None}  # the edgekit command's stop signal (cli.py), when one came


def stop_point() -> None:
    """Raise the stop a signal asked for, when Python dropped it: a handler's exception raised inside a __del__ or a
    weakref callback is printed as "Exception ignored" and the run went on to the end, exit 0. Called between stages
    and training steps; a stop that was raised is being handled and never reaches one."""
    if STOP["at"] is not None:
        import signal

        raise Terminated() if STOP["signal"] == signal.SIGTERM else KeyboardInterrupt()
