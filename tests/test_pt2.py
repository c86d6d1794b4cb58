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

GREEDY = textwrap.dedent("""
    import sys, torch, optimum_dynamo
    from optimum_dynamo.exporters.pt2 import empty_cache
    from transformers import AutoConfig

    out, kind = sys.argv[1], sys.argv[2]
    run = optimum_dynamo.load_program(out).module(check_guards=False) if kind == "pt2" else optimum_dynamo.load_package(out)
    ids = torch.tensor([{prompt}])
    mask = torch.ones_like(ids)
    cache, tokens = empty_cache(AutoConfig.from_pretrained(out)), []
    with torch.no_grad():
        for step in range({new}):
            positions = torch.arange(mask.shape[1] - ids.shape[1], mask.shape[1])[None]
            out = run(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True)
            logits, cache = out["logits"], out["past_key_values"]
            ids = logits[:, -1:].argmax(-1)
            tokens.append(int(ids))
            mask = torch.cat([mask, torch.ones_like(ids)], 1)
    print(tokens)
""").format(prompt=PROMPT, new=NEW_TOKENS)


@pytest.fixture(scope="module")
def pt2_export(checkpoints, tmp_path_factory):
    out = tmp_path_factory.mktemp("pt2") / "out"
    run = optimum_cli("export", "onnx", "--dynamo", "--pt2", "--aoti", "--model", checkpoints("llama"), out)
    assert run.returncode == 0, run.stderr[-3000:]
    return checkpoints("llama"), out


def pytorch_greedy(checkpoint):
    model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([PROMPT]), attention_mask=torch.ones(1, len(PROMPT), dtype=torch.long),
                             do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)
    return out[0, len(PROMPT):].tolist()


@pytest.mark.parametrize("kind", ["pt2", "aoti"])
def test_reloaded_program_generates_pytorch_greedy_tokens(pt2_export, kind):
    checkpoint, out = pt2_export
    manifest = json.loads((out / "optimum_dynamo.json").read_text())
    assert sorted(manifest["programs"]) == ["model.pt2", "model_aoti.pt2"]
    assert max(manifest["programs"].values()) < 1e-4
    run = subprocess.run([sys.executable, "-c", GREEDY, str(out), kind], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1] == str(pytorch_greedy(checkpoint))


def test_pt2_with_encoder_decoder_is_refused(tmp_path):
    from tiny import save_tiny_model

    checkpoint = save_tiny_model("t5", "text2text-generation", tmp_path / "t5")
    run = optimum_cli("export", "onnx", "--dynamo", "--pt2", "--model", checkpoint, "--task",
                      "text2text-generation-with-past", tmp_path / "out")
    assert run.returncode == 1
    assert run.stderr.strip().splitlines()[-1] == (
        "optimum-cli export onnx --dynamo: error: --pt2/--aoti are not supported for encoder-decoder exports yet")
    assert not (tmp_path / "out").exists()
