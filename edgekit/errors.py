class EdgekitError(Exception):
    """A problem the user can fix; the CLI prints it as one line and exits with `code`."""

    code = 1


class UsageError(EdgekitError):
    """A wrong command line or recipe: exit code 2."""

    code = 2
