"""The options of one export, made once at the entry point (CLI, `from_pretrained`, Python API) and read by
every stage: a typed, frozen `ExportOptions`. Values are checked when it is made: a bad value is one error line
before any work, never a finished export that fails at the end; an unknown option name is refused, never
dropped."""

from __future__ import annotations

import dataclasses
import math
from types import MappingProxyType
from typing import Any, Mapping

from .errors import ExportError

# torch 2.13: torch.onnx's dynamo exporter implements opset 18 (torchlib) and converts up to 23
# (`torch.onnx._constants.ONNX_MAX_OPSET`); lower opsets go through a lossy version converter.
MIN_OPSET = 18
MAX_OPSET = 23
HUB_OPTIONS = ("cache_dir", "force_download", "local_files_only", "revision", "subfolder", "token")


@dataclasses.dataclass(frozen=True)
class ExportOptions:
    task: str | None = None  # optimum's task name; None or "auto": inferred
    library: str | None = None  # "transformers", "sentence_transformers" or "timm"; None: inferred as optimum does
    # every backend
    atol: float | None = None  # the export fails when an output differs from PyTorch by more
    dtype: str = "fp32"
    device: str = "cpu"
    trust_remote_code: bool = False
    hub_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # from_pretrained's download options
    pad_token_id: int | None = None
    model_kwargs: Mapping[str, Any] | None = None
    validate: bool = True
    fill: Any = None  # value for inputs a graph takes but a recorded call lacked (see capture docs)
    # ONNX
    opset: int | None = None
    optimize: bool = True  # graph optimizer (False: --no-constant-folding)
    optimize_level: str | None = None  # checked by the ONNX entry points (check_level)
    quantize: str | None = None  # "int4" / "int8": weight-only quantization of the graph (onnx_passes.quantize)
    quantize_head: bool = True  # the vocabulary projection too
    quantize_embeddings: bool = False  # the token embeddings too (4 bits)
    slim: bool = False
    monolith: bool = False
    pt2: bool = False
    aoti: bool = False
    # modules observed by the caller (export_observed): force an axis dynamic or static
    dynamic_batch: bool | None = None
    dynamic_sequence: bool | None = None
    # ExecuTorch
    max_seq_len: int | None = None
    recipe: str = "xnnpack"

    def __post_init__(self):
        set_ = object.__setattr__  # frozen: normalize once, here
        set_(self, "hub_options", MappingProxyType(dict(self.hub_options or {})))
        if self.model_kwargs is not None:
            set_(self, "model_kwargs", MappingProxyType(dict(self.model_kwargs)))
        check_atol(self.atol)
        check_opset(self.opset)
        check_quantize(self)
        unknown = sorted(set(self.hub_options) - set(HUB_OPTIONS))
        if unknown:
            raise ExportError(f"unknown hub option(s) {', '.join(unknown)} (known: {', '.join(HUB_OPTIONS)})")

    @classmethod
    def make(cls, **values) -> ExportOptions:
        """From keyword values (None means the default); an unknown name is an error."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise ExportError(f"unknown export option(s): {', '.join(unknown)}")
        return cls(**{k: v for k, v in values.items() if v is not None or fields[k].default is None})

    def replace(self, **changes) -> ExportOptions:
        return dataclasses.replace(self, **changes)

    @property
    def loading(self) -> dict[str, Any]:
        """Keyword arguments of `from_pretrained` (config, model, preprocessors)."""
        return {"trust_remote_code": self.trust_remote_code, **self.hub_options}


def check_atol(atol) -> None:
    if atol is None:
        return
    if isinstance(atol, bool) or not isinstance(atol, (int, float)) or not math.isfinite(atol) or atol < 0:
        raise ExportError(f"invalid --atol {atol!r}: expected a finite number >= 0")


QUANTIZE = ("int4", "int8")


def check_quantize(options: ExportOptions) -> None:
    """--quantize's value, and the options it cannot be combined with (one line each)."""
    if options.quantize is None:
        if options.quantize_embeddings or not options.quantize_head:
            raise ExportError("--quantize-embeddings / --no-quantize-head apply to --quantize: add --quantize int4|int8")
        return
    if options.quantize not in QUANTIZE:
        raise ExportError(f"invalid --quantize {options.quantize!r} (choose from {', '.join(QUANTIZE)})")
    if not options.optimize:
        raise ExportError("--quantize needs the graph optimizer (weights folded into constants); "
                          "drop --no-constant-folding")
    if options.quantize_embeddings and options.quantize != "int4":
        raise ExportError("--quantize-embeddings: embeddings are stored in 4 bits only (onnxruntime's "
                          "GatherBlockQuantized); use --quantize int4 or drop --quantize-embeddings")
    if options.dtype != "fp32":
        raise ExportError(f"--quantize with --dtype {options.dtype}: quantize from the fp32 export "
                          "(drop --dtype; activations stay fp32, weights are stored in 4 or 8 bits)")


LEVELS = ("O1", "O2", "O3", "O4")
FUSED_LEVELS = ("O3", "O4")


def check_level(level: str | None) -> None:
    """Raise ExportError (one line) for an --optimize level the ONNX exporter cannot honour."""
    if level is None or level in ("O1", "O2", "O3"):
        return
    if level != "O4":
        raise ExportError(f"--optimize {level}: unknown level (choose from {', '.join(LEVELS)})")
    import onnxruntime

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        raise ExportError("--optimize O4 (O3 + fp16) needs a CUDA GPU and onnxruntime-gpu; none is available: use O3")
    raise ExportError("--optimize O4 (O3 + fp16) is not supported with --dynamo yet: use O3")


def check_opset(opset) -> None:
    if opset is None:
        return
    if isinstance(opset, bool) or not isinstance(opset, int) or not MIN_OPSET <= opset <= MAX_OPSET:
        raise ExportError(f"invalid --opset {opset!r}: the dynamo exporter supports opsets {MIN_OPSET} to {MAX_OPSET}")


__all__ = ["FUSED_LEVELS", "LEVELS", "QUANTIZE", "ExportOptions", "check_atol", "check_level", "check_opset",
           "check_quantize"]
