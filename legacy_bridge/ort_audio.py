"""Audio runtime classes of optimum-onnx 0.1.0 (and main at 1939f27) on speech-feature graphs.

`ORTModelForCTC`, `ORTModelForAudioClassification`, `ORTModelForAudioFrameClassification` and
`ORTModelForAudioXVector` feed `input_values` (raw waveforms), except for a model-type list (whisper, mctct) fed
`input_features`, and most of them no `attention_mask`. Models whose processor gives log-mel features
(wav2vec2-bert, parakeet, lasr, ...) export a graph whose main input is `input_features`, with the mask the
processor gives. The wrapper takes `input_features` and `attention_mask` in every class, runs a graph its class's
forward cannot feed with the arrays given, by the graph's own input names, and returns the class's own output
type.
"""

from __future__ import annotations

import functools
import inspect

from .hooks import MethodPatch

_MODULE = "optimum.onnxruntime.modeling"
# the class, the transformers output type it returns
CLASSES = {"ORTModelForCTC": "CausalLMOutput", "ORTModelForAudioClassification": "SequenceClassifierOutput",
           "ORTModelForAudioFrameClassification": "TokenClassifierOutput", "ORTModelForAudioXVector": "XVectorOutput"}


def bridged(model, takes: set[str]) -> bool:
    """The graph needs what the class's own forward cannot give: `input_features` where it feeds waveforms,
    or an `attention_mask` its forward does not take."""
    names = set(model.input_names)
    features = "input_features" in names and "input_values" not in names
    return features or ("attention_mask" in names and "attention_mask" not in takes)


def run(model, output_type: str, given: dict, return_dict: bool = True):
    """One run of the graph on the arrays given, by its own input names (one it takes and the caller did not
    give: optimum's own error line)."""
    import torch
    import transformers.modeling_outputs as outputs

    main = given.get("input_features") if given.get("input_features") is not None else given.get("input_values")
    if main is None:
        raise ValueError(f"input_features must be provided for this model ({model.config.model_type})")
    use_torch = isinstance(main, torch.Tensor)
    onnx_inputs = model._prepare_onnx_inputs(use_torch, {name: given.get(name) for name in model.input_names})
    result = model._prepare_onnx_outputs(use_torch, model.session.run(None, onnx_inputs))
    if not return_dict:
        return tuple(result.values())
    kind = getattr(outputs, output_type)
    return kind(**{k: v for k, v in result.items() if k in kind.__dataclass_fields__})


def _with_inputs(signature: inspect.Signature) -> inspect.Signature:
    """The forward's signature with `input_features` and `attention_mask` (after its positional inputs) where it
    has none."""
    params = list(signature.parameters.values())
    at = next((i for i, p in enumerate(params) if p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD), len(params))
    added = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None)
             for name in ("input_features", "attention_mask") if name not in signature.parameters]
    return signature.replace(parameters=params[:at] + added + params[at:])


def _patcher(output_type: str):
    def apply(cls, original: dict) -> None:
        forward = original["forward"] = cls.forward
        takes = set(inspect.signature(forward).parameters)
        signature = _with_inputs(inspect.signature(forward))

        @functools.wraps(forward)
        def wrapped(self, *args, **kwargs):
            if not bridged(self, takes):
                for name in ("input_features", "attention_mask"):
                    if name not in takes:
                        kwargs.pop(name, None)
                return forward(self, *args, **kwargs)
            given = signature.bind(self, *args, **kwargs).arguments
            inputs = {k: given.get(k) for k in ("input_values", "input_features", "attention_mask")}
            return run(self, output_type, inputs, given.get("return_dict", True))

        wrapped.__signature__ = signature  # what the exporter reads as the inputs this class feeds
        cls.forward = wrapped

    return apply


PATCHES = [MethodPatch(_MODULE, name, _patcher(output)) for name, output in CLASSES.items()]


def install() -> None:
    for patch in PATCHES:
        patch.install()


def uninstall() -> None:
    for patch in PATCHES:
        patch.uninstall()
