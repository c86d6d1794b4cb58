"""Errors shown to users as one line.

`ExportError` is the user's: bad input (a missing directory, an unknown task, a flag value) or a gate the
user set (--atol). The CLI prints it and exits; no fallback can help. `PipelineError` is ours: the dynamo
pipeline failed on a valid model; like any other exception from the pipeline it makes the CLI fall back to
the torchscript exporter where optimum has an OnnxConfig for the model.
"""


class ExportError(RuntimeError):
    """A problem with the user's input; its message is the one line shown."""


class PipelineError(RuntimeError):
    """The dynamo pipeline cannot export this (valid) model; its message is the one line shown."""
