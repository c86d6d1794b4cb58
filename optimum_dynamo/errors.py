"""Errors shown to users as one line.

`ExportError` is the user's: bad input (a missing directory, an unknown task, a flag value) or a gate the
user set (--atol). The CLI prints it and exits; no fallback can help. `PipelineError` is ours: the dynamo
pipeline failed on a valid model; like any other exception from the pipeline it makes the CLI fall back to
the torchscript exporter where optimum has an OnnxConfig for the model. Running out of memory is an
`ExportError` naming the stage (`out_of_memory`): the torchscript exporter needs more memory, not less.
"""

import errno


def first_line(error: BaseException, lines: int = 1, limit: int = 300) -> str:
    """The first non-empty line(s) of an exception's message, at most `limit` characters."""
    text = [line.strip() for line in str(error).splitlines() if line.strip()]
    return " ".join(text[:lines])[:limit]


def describe(error: BaseException, lines: int = 1, limit: int = 300) -> str:
    """`Type: first line` of an exception, as the one-line messages show it."""
    first = first_line(error, lines, limit)
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def out_of_memory(error: BaseException) -> bool:
    """Whether `error` (or what caused it) is the process running out of memory: Python's MemoryError, torch's
    allocator ("can't allocate memory"), a failed mapping (errno ENOMEM, as safetensors reports it)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        text = str(error)
        if isinstance(error, MemoryError) or getattr(error, "errno", None) == errno.ENOMEM \
                or "can't allocate memory" in text or "Cannot allocate memory" in text:
            return True
        error = error.__cause__ or error.__context__
    return False


class ExportError(RuntimeError):
    """A problem with the user's input; its message is the one line shown."""


class PipelineError(RuntimeError):
    """The dynamo pipeline cannot export this (valid) model; its message is the one line shown."""
