"""Errors shown to users as one line."""


class ExportError(RuntimeError):
    """A problem with the user's input or the export; its message is the one line shown."""
