"""optimum's export options under `--dynamo`: one row per option of `optimum-cli export onnx` (and per
keyword of `main_export` / `onnx_export_from_model`), each honoured, refused with the reason, or ignored
with a notice. The options are read from optimum's parser at run time: an option this table does not know
and that is set to a non-default value is refused, never dropped.
"""

from __future__ import annotations

import importlib.util
import inspect
from dataclasses import dataclass
from typing import Any, Callable

from .errors import ExportError
from .options import HUB_OPTIONS

HONOURED, REFUSED, IGNORED = "honoured", "refused", "ignored"
DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


class FlagError(ExportError):
    """An option that --dynamo refuses (the message is the one error line)."""


@dataclass(frozen=True)
class Flag:
    spelling: str  # as users write it (`--dtype`, or the keyword name for Python-only rows)
    kind: str  # HONOURED, REFUSED or IGNORED
    note: str  # what it does under --dynamo, or why it is refused / ignored (one line)
    option: str | None = None  # export option the value is passed as ("hub:x": a hub download option)
    check: Callable[[Any], str | None] | None = None  # value -> reason to refuse it, or None
    convert: Callable[[Any], Any] | None = None  # value -> option value


def _device(value: str) -> str | None:
    if value == "cpu":
        return None
    if value.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            return "no CUDA device is available; export with --device cpu (the ONNX file runs on any device)"
        return "exporting on cuda is not supported with --dynamo yet; export with --device cpu (the ONNX file runs on any device)"
    return "unknown device; use --device cpu"


def _dtype(value: str | None) -> str | None:
    if value in (None, "fp32", "fp16"):
        return None
    return ("onnxruntime's CPU provider has no bfloat16 kernels (MatMul, Add, Mul; onnxruntime 1.31); "
            "export with --dtype fp16 or fp32"
            if value == "bf16" else f"unknown dtype (choose {', '.join(DTYPES)})")


def _variant(value: str | None) -> str | None:
    if value in (None, "default"):
        return None
    return ("optimum's export variants are OnnxConfig layouts (metaclip2, musicgen, speecht5, sam, colpali); "
            "--dynamo has one layout per task: drop --variant or export without --dynamo")


def _library(value: str | None) -> str | None:
    if value in (None, "transformers"):
        return None
    if value == "sentence_transformers":
        return None
    if value == "timm":
        return None if importlib.util.find_spec("timm") else "timm is not installed (pip install timm)"
    return f"{value} models are not exported by --dynamo; export without --dynamo"


def _slim(value: bool) -> str | None:
    if value and importlib.util.find_spec("onnxslim") is None:
        return "onnxslim is not installed (pip install onnxslim), or drop --slim"
    return None


def _refused_if_set(why: str) -> Callable[[Any], str | None]:
    return lambda value: why if value else None


_SHAPES = "ignored with --dynamo: the capture decides the sample shapes, and every axis that can vary is dynamic"


def _shape(spelling: str) -> Flag:
    return Flag(spelling, IGNORED, _SHAPES)


# Keyed by argparse dest (CLI) / keyword name (Python); `main_export` keywords named otherwise are mapped
# in PYTHON_NAMES.
FLAGS: dict[str, Flag] = {
    "model": Flag("--model", HONOURED, "checkpoint directory or hub id"),
    "output": Flag("output", HONOURED, "output directory (written only when every stage passed)"),
    "task": Flag("--task", HONOURED, "optimum's task name; `auto` infers it", "task"),
    "opset": Flag("--opset", HONOURED, "ONNX opset of the translation", "opset"),
    "device": Flag("--device", HONOURED, "cpu; cuda is refused (no GPU export yet; the ONNX file runs on any device)",
                   "device", check=_device),
    "dtype": Flag("--dtype", HONOURED, "fp32, fp16: model loaded, captured, exported and validated in that dtype; "
                  "bf16 refused (onnxruntime CPU); image-text-to-text: fp32 only", "dtype", check=_dtype),
    "optimize": Flag("--optimize", HONOURED, "O1/O2 graph optimizations, O3 adds onnxruntime CPU fusions "
                     "(decoders); O4 and encoder-decoder tasks refused; image-text-to-text: O1/O2", "optimize_level"),
    "monolith": Flag("--monolith", HONOURED, "single-graph tasks give one model.onnx anyway; refused for "
                     "encoder-decoder and image-text-to-text tasks (always several graphs)", "monolith"),
    "no_post_process": Flag("--no-post-process", IGNORED, "ignored with --dynamo: nothing is merged afterwards "
                            "(one model.onnx already serves the first and later decoding steps)"),
    "variant": Flag("--variant", HONOURED, "`default` (optimum's variants are OnnxConfig layouts of metaclip2, "
                    "musicgen, speecht5, sam, colpali; --dynamo has one layout per task)", check=_variant),
    "framework": Flag("--framework", HONOURED, "pt (PyTorch), the only choice", check=lambda v: None if v in (None, "pt")
                      else "only PyTorch models (--framework pt) are exported"),
    "atol": Flag("--atol", HONOURED, "the export fails when an output differs from PyTorch by more", "atol"),
    "cache_dir": Flag("--cache_dir", HONOURED, "hub download cache", "hub:cache_dir"),
    "trust_remote_code": Flag("--trust-remote-code", HONOURED, "allows the checkpoint's own code", "trust_remote_code"),
    "pad_token_id": Flag("--pad_token_id", HONOURED, "set as the config's pad_token_id (used by capture, saved in "
                         "config.json)", "pad_token_id"),
    "library_name": Flag("--library-name", HONOURED, "transformers, sentence_transformers or timm (inferred as "
                         "optimum does when not given); diffusers is refused", "library", check=_library),
    "model_kwargs": Flag("--model-kwargs", HONOURED, "keyword arguments of the model's forward, passed in every "
                         "captured call and fixed in the graph (not image-text-to-text yet)", "model_kwargs"),
    "no_dynamic_axes": Flag("--no-dynamic-axes", REFUSED, "is not supported with --dynamo: every axis that can vary "
                            "is dynamic; drop it"),
    "no_constant_folding": Flag("--no-constant-folding", HONOURED, "skips the graph optimizer (constant folding "
                                "and rewrites)", "optimize", convert=lambda v: not v),
    "slim": Flag("--slim", HONOURED, "runs onnxslim on the saved graph (refused when onnxslim is not installed)",
                 "slim", check=_slim),
    **{dest: _shape(f"--{dest}") for dest in (
        "batch_size", "sequence_length", "num_choices", "width", "height", "num_channels", "feature_size",
        "nb_max_frames", "audio_sequence_length", "point_batch_size", "nb_points_per_image", "visual_seq_length")},
    # added by optimum-dynamo
    "dynamo": Flag("--dynamo", HONOURED, "selects this exporter"),
    "no_fallback": Flag("--no-fallback", HONOURED, "fail instead of falling back to the torchscript exporter"),
    "verbose": Flag("-v/--verbose", HONOURED, "shows debug lines and the libraries' own messages"),
    "pt2": Flag("--pt2", HONOURED, "also writes the torch.export program `model.pt2` (decoder and single-graph tasks)",
                "pt2"),
    "quantize": Flag("--quantize", HONOURED, "int4 / int8: weights of the linear layers stored in 4 or 8 bits "
                     "(onnxruntime MatMulNBits, blocks of 32, symmetric), validated against the fp32 graph; decoders",
                     "quantize"),
    "quantize_head": Flag("--quantize-head/--no-quantize-head", HONOURED, "with --quantize: the vocabulary "
                          "projection quantized too (default) or kept in fp32", "quantize_head"),
    "quantize_embeddings": Flag("--quantize-embeddings", HONOURED, "with --quantize int4: the token embeddings in 4 "
                                "bits too (onnxruntime GatherBlockQuantized; default: kept in fp32)",
                                "quantize_embeddings"),
    "aoti": Flag("--aoti", HONOURED, "also writes an AOTInductor package `model_aoti.pt2` (compiled with the local C++ "
                 "compiler)", "aoti"),
    # Python only (`main_export`, `onnx_export_from_model`)
    **{name: Flag(name, HONOURED, "hub download option", f"hub:{name}")
       for name in HUB_OPTIONS if name != "cache_dir"},  # --cache_dir: its CLI row above
    "do_validation": Flag("do_validation", HONOURED, "False skips the onnxruntime validation stage", "validate"),
    "use_subprocess": Flag("use_subprocess", IGNORED, "ignored with dynamo=True: the export runs in this process"),
    "custom_onnx_configs": Flag("custom_onnx_configs", HONOURED, "refused when given: OnnxConfigs describe the "
                                "torchscript export; --dynamo infers inputs by running the model",
                                check=_refused_if_set("OnnxConfigs are torchscript-only; drop it or pass dynamo=False")),
    "fn_get_submodels": Flag("fn_get_submodels", HONOURED, "refused when given (submodels are chosen by the task)",
                             check=_refused_if_set("not supported with dynamo=True; drop it or pass dynamo=False")),
    "preprocessors": Flag("preprocessors", HONOURED, "refused when given: samples come from the checkpoint's own "
                          "files or are synthesized",
                          check=_refused_if_set("not supported with dynamo=True; drop it or pass dynamo=False")),
}

# `main_export` / `onnx_export_from_model` keyword -> (row, value converter)
PYTHON_NAMES: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "model_name_or_path": ("model", lambda v: v),
    "_variant": ("variant", lambda v: v),
    "do_constant_folding": ("no_constant_folding", lambda v: not v),
}


def spelling(dest: str, table: dict[str, Flag] | None = None) -> str:
    table = FLAGS if table is None else table
    return table[dest].spelling if dest in table else f"--{dest}"


def resolve(values: dict[str, Any], defaults: dict[str, Any],
            table: dict[str, Flag] | None = None) -> tuple[dict[str, Any], list[str]]:
    """Export options from option values (dest -> value), and the notices for ignored options.
    Raises FlagError (one line) for a refused option, or an unknown one set to a non-default value.
    `table`: the command's flag table (default: `export onnx`'s, FLAGS)."""
    table = FLAGS if table is None else table
    options: dict[str, Any] = {"hub_options": {}}
    notices = []
    for dest, value in values.items():
        row, default = table.get(dest), defaults.get(dest)
        if row is None:
            if value != default:
                raise FlagError(f"{spelling(dest, table)} is not known to optimum-dynamo (new in this optimum?): it would "
                                "be ignored, so it is refused; drop it or export without --dynamo")
            continue
        if row.kind == REFUSED:
            if value != default:
                raise FlagError(f"{row.spelling} {row.note}")
            continue
        if row.kind == IGNORED:
            if value != default:
                notices.append(f"{row.spelling} is {row.note}")
            continue
        reason = row.check(value) if row.check else None
        if reason:
            shown = f"{row.spelling} {value}" if isinstance(value, (str, int, float)) and not isinstance(value, bool) else row.spelling
            raise FlagError(f"{shown}: {reason}")
        if row.option is None:
            continue
        value = row.convert(value) if row.convert else value
        if row.option.startswith("hub:"):
            if value is not None and value != default:
                options["hub_options"][row.option[4:]] = value
        else:
            options[row.option] = value
    return options, notices


def cli_defaults() -> dict[str, Any]:
    """Every option of optimum's `export onnx` parser (dest -> default), read from the parser."""
    import argparse

    from optimum.commands.export.onnx import parse_args_onnx

    parser = argparse.ArgumentParser()
    parse_args_onnx(parser)
    return vars(parser.parse_args(["--model", "MODEL", "OUTPUT"]))


def python_values(function: Callable, kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(values, defaults) keyed by table row for a call of optimum's `function` with `kwargs`."""
    params = inspect.signature(function).parameters
    defaults = {name: p.default for name, p in params.items()
                if p.default is not inspect.Parameter.empty and p.kind is not inspect.Parameter.VAR_KEYWORD}

    def keyed(d):
        out = {}
        for name, value in d.items():
            row, convert = PYTHON_NAMES.get(name, (name, lambda v: v))
            out[row] = convert(value)
        return out

    return keyed(kwargs), keyed(defaults)


def markdown_table(table: dict[str, Flag] | None = None) -> str:
    """The table as the docs show it (default: `export onnx`'s, in docs/usage.md)."""
    lines = ["| option | under --dynamo | |", "|---|---|---|"]
    lines += [f"| `{row.spelling}` | {row.kind} | {row.note} |" for row in (FLAGS if table is None else table).values()]
    return "\n".join(lines)


__all__ = ["DTYPES", "FLAGS", "Flag", "FlagError", "HONOURED", "IGNORED", "PYTHON_NAMES", "REFUSED", "cli_defaults",
           "markdown_table", "python_values", "resolve", "spelling"]
