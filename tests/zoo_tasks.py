"""The zoo of the tasks that do not generate: every model type of transformers' own mapping for a task optimum
exports (fill-mask, classification, question answering, images, speech, ...), made tiny by tests/zoo.py's generic
shrink, kept where PyTorch can run it, exported by the real `optimum-cli export onnx --dynamo --task TASK` and run
through optimum's runtime class for the task against PyTorch on a batch of 2 (texts padded with their mask, two
images, two waveforms): every output both have within 1e-4 on real positions, scaled by the output's largest
magnitude where that exceeds 1 (float32 rounding grows with it: a detector's mask logits reach hundreds). Each step
runs in a child process; one row per model type. The table also says whether optimum-onnx's own (torchscript)
registry has the row.

    python tests/zoo_tasks.py --json t5.json [--task TASK ...] [--only TYPE ...] [--first N]
    python tests/zoo_tasks.py --table t4.json t5.json [--docs docs/status.md]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import zoo

HERE = Path(__file__).resolve().parent
ATOL = 1e-4
BEGIN, END = "<!-- zoo-tasks:begin -->", "<!-- zoo-tasks:end -->"  # docs/status.md's generated section
TEXTS = ["hello world", "the quick brown fox jumps over the lazy dog"]


@dataclass(frozen=True)
class Task:
    mapping: str  # transformers.models.auto.modeling_auto.<mapping>
    auto: str  # the PyTorch auto class
    runtime: str  # optimum's runtime class (ORTModelForCustomTasks where optimum has none)
    more: tuple[tuple[str, str], ...] = ()  # (mapping, auto class) of the task's other forms

    def forms(self) -> tuple[tuple[str, str], ...]:
        return ((self.mapping, self.auto),) + self.more


TASKS = {
    "fill-mask": Task("MODEL_FOR_MASKED_LM_MAPPING_NAMES", "AutoModelForMaskedLM", "ORTModelForMaskedLM"),
    "text-classification": Task("MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
                                "AutoModelForSequenceClassification", "ORTModelForSequenceClassification"),
    "token-classification": Task("MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES", "AutoModelForTokenClassification",
                                 "ORTModelForTokenClassification"),
    "question-answering": Task("MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES", "AutoModelForQuestionAnswering",
                               "ORTModelForQuestionAnswering"),
    "multiple-choice": Task("MODEL_FOR_MULTIPLE_CHOICE_MAPPING_NAMES", "AutoModelForMultipleChoice",
                            "ORTModelForMultipleChoice"),
    "feature-extraction": Task("MODEL_MAPPING_NAMES", "AutoModel", "ORTModelForFeatureExtraction"),
    "image-classification": Task("MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES", "AutoModelForImageClassification",
                                 "ORTModelForImageClassification"),
    "automatic-speech-recognition": Task("MODEL_FOR_CTC_MAPPING_NAMES", "AutoModelForCTC", "ORTModelForCTC"),
    "audio-classification": Task("MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES", "AutoModelForAudioClassification",
                                 "ORTModelForAudioClassification"),
    "audio-frame-classification": Task("MODEL_FOR_AUDIO_FRAME_CLASSIFICATION_MAPPING_NAMES",
                                       "AutoModelForAudioFrameClassification", "ORTModelForAudioFrameClassification"),
    "audio-xvector": Task("MODEL_FOR_AUDIO_XVECTOR_MAPPING_NAMES", "AutoModelForAudioXVector",
                          "ORTModelForAudioXVector"),
    "object-detection": Task("MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES", "AutoModelForObjectDetection",
                             "ORTModelForCustomTasks"),
    "semantic-segmentation": Task("MODEL_FOR_SEMANTIC_SEGMENTATION_MAPPING_NAMES",
                                  "AutoModelForSemanticSegmentation", "ORTModelForSemanticSegmentation"),
    # instance / panoptic segmentation: a class and a mask per query (optimum's task; semantic segmenters are the
    # row above)
    "image-segmentation": Task("MODEL_FOR_UNIVERSAL_SEGMENTATION_MAPPING_NAMES", "AutoModelForUniversalSegmentation",
                               "ORTModelForCustomTasks", more=(("MODEL_FOR_INSTANCE_SEGMENTATION_MAPPING_NAMES",
                                                                "AutoModelForInstanceSegmentation"),)),
    "depth-estimation": Task("MODEL_FOR_DEPTH_ESTIMATION_MAPPING_NAMES", "AutoModelForDepthEstimation",
                             "ORTModelForCustomTasks"),
    "zero-shot-image-classification": Task("MODEL_FOR_ZERO_SHOT_IMAGE_CLASSIFICATION_MAPPING_NAMES",
                                           "AutoModelForZeroShotImageClassification",
                                           "ORTModelForZeroShotImageClassification"),
}
IMAGE = {"image-classification", "object-detection", "semantic-segmentation", "image-segmentation", "depth-estimation"}
# backbones of stages (resnet, convnext, swin, ...): one block per stage, 16 channels, 64x64 images (a 32-pixel
# image is one position after a stride of 32); detectors: 8 queries (their top-k over a tiny image's anchors)
TINY_IMAGE = dict(zoo.TINY_VISION, image_size=64, hidden_sizes=16, depths=1, embedding_size=16, embed_dim=16,
                  num_queries=8, num_channels=3, neck_hidden_sizes=16, fusion_hidden_size=16, encoder_hidden_dim=32,
                  decoder_hidden_dim=32, encoder_in_channels=16, decoder_in_channels=32, encoder_n_points=2,
                  decoder_n_points=2, num_groups=8)
AUDIO = {"automatic-speech-recognition", "audio-classification", "audio-frame-classification", "audio-xvector"}


def population(task: str) -> list[str]:
    from transformers.models.auto import modeling_auto

    return sorted(set().union(*(getattr(modeling_auto, mapping, {}) for mapping, _ in TASKS[task].forms())))


def in_optimum_registry(model_type: str, task: str) -> bool:
    """optimum-onnx's torchscript path has an OnnxConfig for this type and task (registered when its model_configs
    module is imported)."""
    import optimum.exporters.onnx.model_configs  # noqa: F401  (registers them)
    from optimum.exporters.tasks import TasksManager

    for name in dict.fromkeys([model_type, model_type.replace("_", "-")]):
        try:
            return task in TasksManager.get_supported_tasks_for_model_type(name, exporter="onnx",
                                                                           library_name="transformers")
        except KeyError:
            continue
    return False


def _vocab(config) -> int:
    for part in (config, getattr(config, "text_config", None)):
        if isinstance(getattr(part, "vocab_size", None), int):
            return min(part.vocab_size, 128) if part.vocab_size >= 8 else 128
    return 128


def _inputs(task: str, model, config, tokenizer) -> dict:
    """The task's batch of 2 by the model's main input: texts padded (2 questions x 2 choices for multiple choice),
    images at the config's size (else 64, as the capture), waveforms of 6000 samples."""
    import inspect

    import torch

    from optimum_dynamo.capture.samples import main_input, mask_through_kwargs  # main: a vision tower may inherit
    # the default `input_ids`

    generator = torch.Generator().manual_seed(0)
    main, takes = main_input(model), inspect.signature(model.forward).parameters
    # the capture's first size (64 where the config names none): a model that branches on the size is fixed at it
    side = getattr(config, "image_size", None) or getattr(getattr(config, "vision_config", None), "image_size", 64)
    side = side if isinstance(side, int) else side[0]
    if main == "pixel_values":
        return {"pixel_values": torch.randn(2, getattr(config, "num_channels", 3), side, side, generator=generator)}
    if main == "input_values":
        return {"input_values": torch.randn(2, 6000, generator=generator) * 0.3}
    if main != "input_ids":
        raise ValueError(f"main input {main} is not text, images or waveforms")
    texts = [t for t in TEXTS for _ in range(2)] if task == "multiple-choice" else TEXTS
    if "pixel_values" in takes:  # dual encoders' text towers pool at the first eos: texts end with it, padded on
        texts = [f"{t} {tokenizer.eos_token}" for t in texts]  # the right, as CLIP-style tokenizers (and the saved
        tokenizer.padding_side = "right"  # checkpoint's) do
    # what the model takes, and the mask as pipelines give it to a forward that takes it through **kwargs (OmniASR)
    through_kwargs = {"attention_mask"} if mask_through_kwargs(takes) else set()
    batch = {k: v for k, v in tokenizer(texts, return_tensors="pt", padding=True).items()
             if k in takes or k in through_kwargs}
    if task == "multiple-choice":
        batch = {k: v.reshape(2, 2, -1) for k, v in batch.items()}
    if "pixel_values" in takes:  # dual encoders: 2 texts x 3 images
        batch["pixel_values"] = torch.randn(3, 3, side, side, generator=generator)
    return batch


def _tensors(outputs) -> dict:
    import torch

    return {k: v for k, v in dict(outputs).items() if isinstance(v, torch.Tensor)}


def off_initial_values(model, every_weight: bool) -> None:
    """Seeded noise on the weights (`every_weight`: image models, whose zero heads and prior biases tie a detector's
    query scores, whose top-k then picks them in any order, a trained one's does not), else on the matrices initialized
    to zeros (AFMoE's router: every expert ties, and onnxruntime's top-k breaks ties otherwise than PyTorch's)."""
    import torch

    with torch.no_grad():
        for weight in model.parameters():
            if every_weight or (weight.dim() > 1 and not weight.any()):
                weight.add_(torch.randn(weight.shape, generator=torch.Generator().manual_seed(weight.numel())) * 0.2)


def step_build(task: str, model_type: str, directory: Path) -> dict:
    """Child: the tiny checkpoint (with a tokenizer for text models) and PyTorch's outputs as the reference."""
    import torch
    import transformers
    from transformers.models.auto import modeling_auto

    sys.path.insert(0, str(HERE))
    from tiny import tiny_tokenizer

    try:
        tiny = zoo.TINY_AUDIO if task in AUDIO else TINY_IMAGE if task in IMAGE else zoo.TINY_VISION
        config = zoo.tiny_config(model_type, tiny, stages=task in AUDIO | IMAGE)
        mapping, auto = next((m, a) for m, a in TASKS[task].forms() if model_type in getattr(modeling_auto, m, {}))
        named = getattr(modeling_auto, mapping)[model_type]
        if isinstance(named, tuple):  # several classes (deit: with a teacher): a checkpoint names its own
            config.architectures = [named[0]]
        if config.is_encoder_decoder and getattr(config, "decoder_start_token_id", None) is None:
            config.decoder_start_token_id = config.pad_token_id  # T5's checkpoints set it (the pad id); transformers
            # 5's config class leaves it out
        torch.manual_seed(0)
        model = getattr(transformers, auto).from_config(config).eval()
        off_initial_values(model, every_weight=task in IMAGE)
        from optimum_dynamo.capture.samples import main_input

        main = main_input(model)
        tokenizer = tiny_tokenizer(_vocab(config)) if main == "input_ids" else None
        if tokenizer is not None and config.is_encoder_decoder:  # BART-style classifiers pool at the eos token:
            from tokenizers import processors  # texts end with it, as their tokenizers (and the saved one) add it

            tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
                single="$A </s>", special_tokens=[("</s>", tokenizer.eos_token_id)])
        # the audio tasks, and a speech encoder's features (its main input the extractor's log-mel `input_features`)
        speech = task in AUDIO or main == "input_features"
        extractor = zoo.feature_extractor(model_type, model, config) if speech else None
        inputs = zoo.speech_inputs(model, extractor) if extractor else _inputs(task, model, config, tokenizer)
        with torch.no_grad():
            outputs = _tensors(model(**inputs))
        model.save_pretrained(directory / "checkpoint")
        for files in (tokenizer, extractor):
            if files is not None:
                files.save_pretrained(directory / "checkpoint")
        getattr(transformers, auto).from_pretrained(directory / "checkpoint")  # a user loads it back (4.57's evolla:
        # its saved architecture is not recognized)
    except Exception as e:  # PyTorch cannot run it: outside the population
        return {"viable": False, "reason": zoo.one_line(e)}
    torch.save({"inputs": inputs, "outputs": outputs}, directory / "reference.pt")
    return {"viable": True, "optimum": in_optimum_registry(model_type, task)}


def step_check(task: str, directory: Path) -> dict:
    """Child: the export through optimum's runtime class against PyTorch's outputs (real positions of a padded
    text batch)."""
    import optimum.onnxruntime
    import torch

    reference = torch.load(directory / "reference.pt")
    inputs, expected = reference["inputs"], reference["outputs"]
    from optimum_dynamo.manifest import MANIFEST_FILE, read_manifest

    # --dynamo's manifest names the class of the task's form for the model (the fallback's names none)
    exported = directory / "onnx"
    runtime = read_manifest(exported).get("runtime") if (exported / MANIFEST_FILE).exists() else None
    runtime = runtime.rpartition(".")[2] if runtime else TASKS[task].runtime
    try:
        got = getattr(optimum.onnxruntime, runtime).from_pretrained(directory / "onnx")(**inputs)
    except Exception as e:
        return {"ok": False, "reason": f"runtime: {zoo.one_line(e)}"}
    mask = inputs.get("attention_mask")
    worst, compared = 0.0, []
    for name, value in expected.items():
        if name not in got or got[name] is None:
            continue
        other = torch.as_tensor(got[name])
        if other.shape != value.shape:
            return {"ok": False, "reason": f"{name}: shape {tuple(other.shape)}, PyTorch {tuple(value.shape)}"}
        if mask is not None and value.shape[:mask.dim()] == mask.shape:  # per token: real positions only
            value, other = value[mask.bool()], other[mask.bool()]
        scale = max(1.0, value.float().abs().max().item()) if value.numel() else 1.0
        worst = max(worst, (other.float() - value.float()).abs().max().item() / scale if value.numel() else 0.0)
        compared.append(name)
    if not compared:
        return {"ok": False, "reason": f"no output in common: PyTorch {sorted(expected)}, runtime {sorted(got.keys())}"}
    if not worst < ATOL:
        return {"ok": False, "reason": f"outputs differ by {worst:.1e} (relative to outputs above 1)", "max_scaled": worst}
    return {"ok": True, "max_scaled": worst, "compared": compared}


def run_one(task: str, model_type: str, root: Path) -> dict:
    """One row: viable?, then the export's outcome (dynamo / fallback / refused / fail) and its wall time."""
    directory = root / task / model_type
    directory.mkdir(parents=True, exist_ok=True)
    row = {"model_type": model_type, **zoo.child("--step", "build", task, model_type, str(directory),
                                                 script=__file__)}
    if not row["viable"]:
        return row
    row.update(zoo.cli_export(directory, task))
    if "outcome" in row:
        return row
    check = zoo.child("--step", "check", task, str(directory), script=__file__)
    exporter = row.pop("exporter")
    row.update(outcome=exporter if check["ok"] else "fail", reason=check.get("reason", ""),
               max_scaled=check.get("max_scaled"))
    return row


def run(tasks: list[str], only: list[str] | None, first: int | None, out: Path, root: Path) -> None:
    results = json.loads(out.read_text()) if out.exists() else {"versions": zoo.versions(), "tasks": {}}
    if results["versions"]["transformers"] != zoo.versions()["transformers"]:
        raise SystemExit(f"{out} holds rows of transformers {results['versions']['transformers']}, this is "
                         f"{zoo.versions()['transformers']}: name another file")
    for task in tasks:
        types = [t for t in population(task) if t in only] if only else population(task)[:first]
        rows = results["tasks"].setdefault(task, {})
        for model_type in types:
            rows[model_type] = run_one(task, model_type, root)
            print(task, model_type, rows[model_type].get("outcome", "not viable"),
                  rows[model_type].get("reason", ""), flush=True)
            out.write_text(json.dumps(results, indent=1))


def _cell(row: dict | None) -> str:
    if row is None:
        return "—"
    if not row["viable"]:
        return "not viable"
    outcome = row["outcome"]
    return outcome if outcome in ("dynamo", "fallback") else f"{outcome}: {row.get('reason', '')[:80]}"


def table(paths: list[Path]) -> str:
    """Per task: its mapping's size, rows tried, passing with --dynamo itself / through the fallback, and per row
    each environment's outcome beside optimum-onnx's registry."""
    found = [json.loads(p.read_text()) for p in paths]
    names = [f"transformers {r['versions']['transformers']}" for r in found]
    lines = []
    for task in TASKS:
        per_env = [r["tasks"].get(task, {}) for r in found]
        types = sorted(set().union(*per_env))
        if not types:
            continue
        counts = []
        for name, rows in zip(names, per_env):
            viable = [row for row in rows.values() if row["viable"]]
            dynamo = sum(row.get("outcome") == "dynamo" for row in viable)
            fallback = sum(row.get("outcome") == "fallback" for row in viable)
            counts.append(f"{name}: {dynamo} of {len(viable)} viable with --dynamo itself, {fallback} through the "
                          f"fallback ({len(rows)} tried)")
        lines += [f"### {task}", "", "; ".join(counts) + ".", "",
                  "| model type | " + " | ".join(names) + " | optimum-onnx registry |",
                  "|---|" + "---|" * (len(names) + 1)]
        for model_type in types:
            rows = [rows.get(model_type) for rows in per_env]
            registry = next((row["optimum"] for row in rows if row and "optimum" in row), None)
            lines.append(f"| {model_type} | " + " | ".join(_cell(row) for row in rows)
                         + f" | {'yes' if registry else 'no' if registry is not None else '—'} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    zoo.shared_arguments(parser)
    parser.add_argument("--task", nargs="*", choices=TASKS, help="these tasks only (default: all)")
    parser.add_argument("--first", type=int, help="the first N model types of each mapping (alphabetically)")
    args = parser.parse_args()
    if args.step:
        step, task, *rest = args.step
        result = step_build(task, rest[0], Path(rest[1])) if step == "build" else step_check(task, Path(rest[0]))
        print(json.dumps(result))
        return
    if args.table:
        zoo.show_table(args, table(args.table), BEGIN, END)
        return
    import tempfile

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory() as tmp:
        run(args.task or list(TASKS), args.only, args.first, args.json, args.work or Path(tmp))


if __name__ == "__main__":
    main()
