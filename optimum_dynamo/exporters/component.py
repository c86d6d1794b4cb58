"""A component: one graph of an export. A decoder export is a list of one; an encoder-decoder export is
encoder, decoder and decoder-with-past; a VLM export is its four parts. The stages run once per component,
from one definition (`base.Exporter`, the backends); exporters differ only in how they build the list."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from ..capture import InputObserver


@dataclass
class Component:
    name: str  # file stem, optimum's name ("model", "encoder_model", "decoder_with_past_model", ...)
    observer: InputObserver  # the module and the calls recorded for it
    inputs: Sequence[str]  # forward parameters the graph takes
    constants: dict[str, Any] = field(default_factory=dict)  # fixed keyword arguments of the exported forward
    labels: dict[str, str] = field(default_factory=dict)  # inferred axis name -> the name used here
    dynamic_batch: bool = True  # False: a batch size that never varied stays fixed
    dynamic_sequence: bool = False  # True: the sequence axis is dynamic even if every call had one length
    keep: str = "*"  # outputs written (fnmatch patterns, comma-separated); others are dropped
    drop_unused: tuple[str, ...] = ()  # inputs removed when the optimized graph does not read them
    directory: str = ""  # sub-directory of the output holding its files ("" : the output itself)
    stem: str = ""  # its graph file's stem ("": optimum's, `model` in a directory of its own, else its name)
    weights: str = ""  # an external-data file it shares with other graphs in its directory ("": its own)
    size_oblivious: bool = True  # trace 0/1-sized axes as general sizes (an empty cache on the first step)
    strict: bool = False  # torch.export's strict mode
    image_size_chosen: bool = False  # the driver varied the image size by its own choice (see size_guards)
    metadata: dict[str, str] = field(default_factory=dict)  # written into the graph's metadata_props
    # made by the stages
    arguments: Any = None  # capture.ExportArguments
    program: torch.export.ExportedProgram | None = None
    random_draws: tuple[str, ...] = ()  # random-number ops of the program (ViT-MAE's masking noise)
    onnx_program: Any = None
    output_names: list[str] = field(default_factory=list)
    inputs_kept: list[str] = field(default_factory=list)  # the saved graph's inputs
    contrib_ops: dict[str, int] = field(default_factory=dict)
    unfused: dict[str, str] = field(default_factory=dict)  # fusion that matched nothing -> why
    discrepancies: list[Any] = field(default_factory=list)
    quantization: dict[str, Any] | None = None  # --quantize: the scheme, what was kept, the validation rows

    @property
    def module(self) -> torch.nn.Module:
        return self.observer.module

    @property
    def calls(self):
        return self.observer.calls

    def path(self, file: str) -> str:
        """`file` of this component, relative to the output directory."""
        return f"{self.directory}/{file}" if self.directory else file


__all__ = ["Component"]
