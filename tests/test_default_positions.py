"""Default positions: a plain call of the exported model without `position_ids` means what it means in
PyTorch. RoBERTa-style decoders number positions from the padding index; the export finds that rule by
running the model, writes it into the graph's metadata, and ORTModelForCausalLM applies it (legacy_bridge).
Decoders that count 0.. like optimum's runtime record nothing."""

import onnx
import pytest
import transformers
from optimum.onnxruntime import ORTModelForCausalLM
from packaging.version import Version
from transformers import AutoModelForCausalLM, AutoTokenizer

from legacy_bridge.positions import METADATA_KEY
from parity import assert_causal_lm_parity, padded_batch
from tiny import save_tiny_decoder

from conftest import cli_export

V5 = Version(transformers.__version__) >= Version("5")
# transformers 5: these BERT-family decoders return no cache, so `-with-past` is refused; plain text generation
TASK = "text-generation" if V5 else "text-generation-with-past"


@pytest.mark.parametrize("model_type, rule", [
    ("roberta", "padding:0"),  # the tiny checkpoints pad with id 0
    ("xlm-roberta", "padding:0"),
    ("llama", None),
])
def test_plain_call_numbers_positions_as_pytorch_does(model_type, rule, tmp_path):
    extra = {} if model_type == "llama" else {"is_decoder": True}
    checkpoint = save_tiny_decoder(model_type, tmp_path / "checkpoint", **extra)
    out = cli_export(tmp_path / "onnx", "--model", checkpoint, "--task", TASK)
    metadata = {p.key: p.value for p in onnx.load(out / "model.onnx", load_external_data=False).metadata_props}
    assert metadata.get(METADATA_KEY) == rule
    ort_model = ORTModelForCausalLM.from_pretrained(out, use_cache=not V5)
    torch_model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    inputs = padded_batch(AutoTokenizer.from_pretrained(checkpoint))
    assert_causal_lm_parity(ort_model, torch_model, inputs)  # plain call: logits within 1e-4; greedy tokens
