"""Errors shown to users as one line.

`ExportError` is the user's: bad input (a missing directory, an unknown task, a flag value) or a gate the
user set (--atol). The CLI prints it and exits; no fallback can help. `PipelineError` is ours: the dynamo
pipeline failed on a valid model; like any other exception from the pipeline it makes the CLI fall back to
the torchscript exporter where optimum has an OnnxConfig for the model.
"""


def first_line(error: BaseException, lines: int = 1, limit: int = 300) -> str:
    """The first non-empty line(s) of an exception's message, at most `limit` characters."""
    text = [line.strip() for line in str(error).splitlines() if line.strip()]
    return " ".join(text[:lines])[:limit]


def describe(error: BaseException, lines: int = 1, limit: int = 300) -> str:
    """`Type: first line` of an exception, as the one-line messages show it."""
    first = first_line(error, lines, limit)
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


class ExportError(RuntimeError):
    """A problem with the user's input; its message is the one line shown."""


class PipelineError(RuntimeError):
    """The dynamo pipeline cannot export this (valid) model; its message is the one line shown."""
