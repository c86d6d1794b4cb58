"""Default positions: a plain call of the exported model without `position_ids` means what it means in
PyTorch. RoBERTa-style decoders number positions from the padding index; the export finds that rule by
running the model, writes it into the graph's metadata, and ORTModelForCausalLM applies it (legacy_bridge).
Decoders that count 0.. like optimum's runtime record nothing."""

import onnx
import torch
import pytest
import transformers
from optimum.onnxruntime import ORTModelForCausalLM
from packaging.version import Version
from transformers import AutoModelForCausalLM, AutoTokenizer

from legacy_bridge.positions import GENERATE_KEY, METADATA_KEY
from parity import assert_causal_lm_parity, padded_batch
from tiny import save_tiny_decoder

from conftest import cli_export

V5 = Version(transformers.__version__) >= Version("5")
# transformers 5: these BERT-family decoders return no cache, so `-with-past` is refused; plain text generation
TASK = "text-generation" if V5 else "text-generation-with-past"


@pytest.mark.parametrize("model_type, rule, generate_rule", [
    # the tiny checkpoints pad with id 0; generate passes transformers' own (CI: one environment each)
    pytest.param("roberta", "padding:0", None, marks=pytest.mark.once("t4")),
    pytest.param("xlm-roberta", "padding:0", None, marks=pytest.mark.once("t5")),
    # transformers 4: its own prepare_inputs_for_generation numbers them from the padding index too
    ("xlm-roberta-xl", "padding:0", None if V5 else "padding:0"),
    ("llama", None, None),  # the session's export (text-generation-with-past), shared with test_decoder_cli
])
def test_plain_call_and_generate_number_positions_as_pytorch_does(model_type, rule, generate_rule, checkpoints,
                                                                   dynamo_exports, tmp_path):
    if model_type == "llama":
        checkpoint, out, use_cache = checkpoints(model_type), dynamo_exports(model_type), True
    else:
        checkpoint = save_tiny_decoder(model_type, tmp_path / "checkpoint", is_decoder=True)
        out, use_cache = cli_export(tmp_path / "onnx", "--model", checkpoint, "--task", TASK), not V5
    metadata = {p.key: p.value for p in onnx.load(out / "model.onnx", load_external_data=False).metadata_props}
    assert (metadata.get(METADATA_KEY), metadata.get(GENERATE_KEY)) == (rule, generate_rule)
    ort_model = ORTModelForCausalLM.from_pretrained(out, use_cache=use_cache)
    torch_model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    inputs = padded_batch(AutoTokenizer.from_pretrained(checkpoint))
    assert_causal_lm_parity(ort_model, torch_model, inputs)  # plain call: logits within 1e-4; greedy tokens
    options = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False, output_logits=True,
                   return_dict_in_generate=True)
    with torch.no_grad():
        expected = torch_model.generate(**inputs, **options)
    got = ort_model.generate(**inputs, **options)
    # every step's logits, not only the first (each step's positions come from generate)
    assert max((a - b).abs().max().item() for a, b in zip(expected.logits, got.logits)) < 1e-4
