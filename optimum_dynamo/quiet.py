"""What the user reads: our stage lines, the discrepancy table and warnings that concern the user.

Every message of this package goes through the `optimum_dynamo` logger hierarchy. During an export,
third-party progress lines and warnings about their own internals are quieted, unless the user asks
for them: `--verbose` (the `optimum_dynamo` logger at DEBUG) brings everything back, and a level set
explicitly on a third-party logger (e.g. `logging.getLogger("torch.onnx").setLevel("INFO")`) is kept.
"""

from __future__ import annotations

import logging
import warnings
from contextlib import contextmanager
from typing import Iterator

LOGGER = "optimum_dynamo"
# Loggers of the libraries an export runs, whose INFO/WARNING lines are about their internals
# (e.g. torch.onnx's "torchvision is not installed. Skipping torchvision::nms").
NOISY_LOGGERS = ("torch.onnx", "torch.export", "torch._export", "torch.fx", "torch._dynamo", "torch.utils._sympy",
                 "onnxscript", "onnx_ir")
# Loggers that speak when their library is imported, about its own build (torchao, pulled in by executorch and
# imported by transformers: "Failed to load .../torchao/_C_mxfp8...so"): quiet for the whole CLI run.
IMPORT_NOISE = ("torchao", "torch.utils._pytree")
# Warnings raised inside torch/onnxscript about their own APIs, which the user cannot act on.
NOISY_WARNINGS = (
    (FutureWarning, r".*LeafSpec.*"),
    (DeprecationWarning, r".*"),
)


def logger(name: str = "") -> logging.Logger:
    return logging.getLogger(f"{LOGGER}.{name}" if name else LOGGER)


def is_verbose() -> bool:
    return logger().isEnabledFor(logging.DEBUG)


def configure_cli(verbose: bool = False) -> None:
    """The CLI's output: our messages on stderr, plain; DEBUG and third-party noise with --verbose."""
    root = logger()
    if not any(getattr(h, "_optimum_dynamo", False) for h in root.handlers):
        handler = logging.StreamHandler()
        handler._optimum_dynamo = True
        root.addHandler(handler)
        root.propagate = False
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    if not verbose:
        for log in map(logging.getLogger, IMPORT_NOISE):
            if log.level == logging.NOTSET:
                log.setLevel(logging.ERROR)


@contextmanager
def import_noise() -> Iterator[None]:
    """Quiet IMPORT_NOISE while importing a module that imports those libraries (levels set by the user kept)."""
    lowered = lower_import_noise()
    try:
        yield
    finally:
        restore(lowered)


def lower_import_noise() -> list[tuple[logging.Logger, int]]:
    """IMPORT_NOISE's loggers at ERROR where no level is set; returns what `restore` puts back."""
    lowered = [(log, log.level) for log in map(logging.getLogger, IMPORT_NOISE) if log.level == logging.NOTSET]
    for log, _ in lowered:
        log.setLevel(logging.ERROR)
    return lowered


def restore(lowered: list[tuple[logging.Logger, int]]) -> None:
    for log, level in lowered:
        log.setLevel(level)


_importing: list = []


def while_importing(_module) -> None:
    """A hook run right before a module known to import IMPORT_NOISE's libraries (`activation`), `imported` after
    it: optimum-cli imports optimum-executorch's command (transformers.pipelines, torchao) before our CLI code runs,
    and torch >= 2.15 warns about torchao's pytree constants at that import."""
    _importing.append(lower_import_noise())


def imported(_module) -> None:
    if _importing:
        restore(_importing.pop())


@contextmanager
def third_party(also: tuple[str, ...] = (), all_warnings: bool = False) -> Iterator[None]:
    """Quiet the libraries' own lines for the duration of an export (nothing changes when verbose);
    `also`: more loggers to quiet, `all_warnings`: every Python warning (the torchscript exporter's)."""
    if is_verbose():
        yield
        return
    lowered = [(log, log.level) for log in map(logging.getLogger, NOISY_LOGGERS) if log.level == logging.NOTSET]
    lowered += [(log, log.level) for log in map(logging.getLogger, also) if log.level < logging.ERROR]
    for log, _ in lowered:
        log.setLevel(logging.ERROR)
    bars = _progress_bars(False)
    try:
        with warnings.catch_warnings():
            for category, message in NOISY_WARNINGS:
                warnings.filterwarnings("ignore", message=message, category=category)
            if all_warnings:
                warnings.simplefilter("ignore")
            yield
    finally:
        for log, level in lowered:
            log.setLevel(level)
        _progress_bars(bars)


def _progress_bars(enabled: bool) -> bool:
    """Turn transformers' progress bars (transformers 5: "Loading weights") on or off; returns the previous state."""
    from transformers.utils import logging as transformers_logging

    previous = transformers_logging.is_progress_bar_enabled()
    (transformers_logging.enable_progress_bar if enabled else transformers_logging.disable_progress_bar)()
    return previous


@contextmanager
def printed_graphs() -> Iterator[None]:
    """Drop what torch prints on stderr itself (not through logging) unless verbose: a failed torch.export
    prints the partial FX graph, thousands of lines, before the error the CLI reports in one line."""
    if is_verbose():
        yield
        return
    import contextlib
    import io

    with contextlib.redirect_stderr(io.StringIO()):  # our handler keeps the real stream
        yield


class _Drop(logging.Filter):
    def __init__(self, text: str):
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


@contextmanager
def without_message(logger_name: str, text: str) -> Iterator[None]:
    """Drop the records of `logger_name` containing `text` (a warning known to be false here)."""
    log, drop = logging.getLogger(logger_name), _Drop(text)
    log.addFilter(drop)
    try:
        yield
    finally:
        log.removeFilter(drop)
