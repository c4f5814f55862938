class EdgekitError(Exception):
    """A problem the user can fix; the CLI prints it as one line and exits with `code`."""

    code = 1

    def __init__(self, message: str):
        # user values quoted inside a message may hold line breaks: keep the message one line, faithfully
        super().__init__(message.replace("\r", "\\r").replace("\n", "\\n"))


class UsageError(EdgekitError):
    """A wrong command line or recipe: exit code 2."""

    code = 2
