"""`--pt2` / `--aoti`: the torch.export program and an AOTInductor package beside the ONNX export, each read
back in a fresh process through the package's documented loaders and decoding PyTorch's greedy tokens."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from transformers import AutoModelForCausalLM

from conftest import optimum_cli

PROMPT = [1, 5, 9, 13, 17]
NEW_TOKENS = 12

PT2_GREEDY = textwrap.dedent("""
    import sys, torch, optimum_dynamo
    from legacy_bridge import cache_argument
    from optimum_dynamo.exporters.pt2 import empty_cache
    from transformers import AutoConfig

    out = sys.argv[1]
    run = optimum_dynamo.load_program(out).module()
    ids = torch.tensor([{prompt}])
    mask = torch.ones_like(ids)
    cache, tokens = empty_cache(AutoConfig.from_pretrained(out)), []
    with torch.no_grad():
        for step in range({new}):
            positions = torch.arange(mask.shape[1] - ids.shape[1], mask.shape[1])[None]
            out = run(input_ids=ids, attention_mask=mask, position_ids=positions, **{{cache_argument.name(): cache}},
                      use_cache=True)
            logits, cache = out["logits"], cache_argument.of(out)
            ids = logits[:, -1:].argmax(-1)
            tokens.append(int(ids))
            mask = torch.cat([mask, torch.ones_like(ids)], 1)
    print(tokens)
""").format(prompt=PROMPT, new=NEW_TOKENS)

# torch alone: transformers and the package cannot be imported in this process
AOTI_GREEDY = textwrap.dedent("""
    import json, sys
    sys.modules["transformers"] = sys.modules["optimum_dynamo"] = None
    import torch
    from torch._inductor import aoti_load_package

    out = sys.argv[1]
    names = json.load(open(out + "/model_aoti.json"))
    run = aoti_load_package(out + "/model_aoti.pt2")
    config = json.load(open(out + "/config.json"))
    kv, dim = config["num_key_value_heads"], config["hidden_size"] // config["num_attention_heads"]
    ids = torch.tensor([{prompt}])
    mask = torch.ones_like(ids)
    past = {{n: torch.zeros(1, kv, 0, dim) for n in names["inputs"] if n.startswith("past_key_values.")}}
    tokens = []
    with torch.no_grad():
        for step in range({new}):
            positions = torch.arange(mask.shape[1] - ids.shape[1], mask.shape[1])[None]
            feed = dict(input_ids=ids, attention_mask=mask, position_ids=positions, **past)
            outputs = dict(zip(names["outputs"], run(*[feed[n] for n in names["inputs"]])))
            past = {{n.replace("present", "past_key_values"): v for n, v in outputs.items() if n.startswith("present.")}}
            ids = outputs["logits"][:, -1:].argmax(-1)
            tokens.append(int(ids))
            mask = torch.cat([mask, torch.ones_like(ids)], 1)
    print(tokens)
""").format(prompt=PROMPT, new=NEW_TOKENS)


def _export(checkpoints, tmp_path_factory, *flags):
    out = tmp_path_factory.mktemp("pt2") / "out"
    run = optimum_cli("export", "onnx", "--dynamo", *flags, "--model", checkpoints("llama"), out)
    assert run.returncode == 0, run.stderr[-3000:]
    return checkpoints("llama"), out


@pytest.fixture(scope="module")
def pt2_export(checkpoints, tmp_path_factory):
    return _export(checkpoints, tmp_path_factory, "--pt2")


# AOTInductor compiles C++ (about a minute on 2 cores): in one environment, the newest torch (make test-all: both)
@pytest.fixture(scope="module")
def aoti_export(checkpoints, tmp_path_factory):
    return _export(checkpoints, tmp_path_factory, "--pt2", "--aoti")


def pytorch_greedy(checkpoint):
    model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([PROMPT]), attention_mask=torch.ones(1, len(PROMPT), dtype=torch.long),
                             do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)
    return out[0, len(PROMPT):].tolist()


@pytest.mark.once("t5")
def test_manifest_and_package_names(aoti_export):
    _, out = aoti_export
    manifest = json.loads((out / "optimum_dynamo.json").read_text())
    assert sorted(manifest["programs"]) == ["model.pt2", "model_aoti.pt2"]
    assert max(manifest["programs"].values()) < 1e-4  # on every captured call
    io = json.loads((out / "model_aoti.json").read_text())
    assert io == {"inputs": manifest["inputs"], "outputs": manifest["outputs"]}  # the ONNX graph's names


@pytest.mark.parametrize("kind", [pytest.param("pt2", marks=pytest.mark.once("t4")),  # CI: one each
                                  pytest.param("aoti", marks=pytest.mark.once("t5"))])
def test_reloaded_program_generates_pytorch_greedy_tokens(request, kind):
    """In a fresh process, batch 1 from an empty cache, one token per step after the prompt: `model.pt2` through
    the documented loader with its guards on; the AOTInductor package with torch alone."""
    checkpoint, out = request.getfixturevalue(f"{kind}_export")
    script = PT2_GREEDY if kind == "pt2" else AOTI_GREEDY
    run = subprocess.run([sys.executable, "-c", script, str(out)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1] == str(pytorch_greedy(checkpoint))


@pytest.mark.once("t4")
def test_main_export_writes_the_program(checkpoints, tmp_path):
    from optimum.exporters.onnx import main_export

    main_export(str(checkpoints("llama")), str(tmp_path / "out"), dynamo=True, pt2=True)
    manifest = json.loads((tmp_path / "out" / "optimum_dynamo.json").read_text())
    assert list(manifest["programs"]) == ["model.pt2"] and manifest["programs"]["model.pt2"] < 1e-4
    assert not (tmp_path / "out" / "model_aoti.pt2").exists()


@pytest.mark.once("t4")  # CI: a refusal of ours, in one environment (make test-all: both)
def test_pt2_with_encoder_decoder_is_refused(tmp_path):
    from tiny import save_tiny_model

    checkpoint = save_tiny_model("t5", "text2text-generation", tmp_path / "t5")
    run = optimum_cli("export", "onnx", "--dynamo", "--pt2", "--model", checkpoint, "--task",
                      "text2text-generation-with-past", tmp_path / "out")
    assert run.returncode == 1
    assert run.stderr.strip().splitlines()[-1] == (
        "optimum-cli export onnx --dynamo: error: --pt2/--aoti are not supported for encoder-decoder exports yet")
    assert not (tmp_path / "out").exists()
