"""The main job, end to end on a tiny local checkpoint (no Hub):

build a tiny llama + tokenizer -> `optimum-cli export onnx --dynamo` -> ORTModelForCausalLM ->
generate text, and print the measured max |onnxruntime - PyTorch| logits difference.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

PROMPT = "the quick brown fox"


def main() -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from optimum.onnxruntime import ORTModelForCausalLM
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from optimum_dynamo.manifest import read_manifest
    from tiny import save_tiny_decoder

    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = save_tiny_decoder("llama", Path(tmp) / "tiny-llama")
        output = Path(tmp) / "tiny-llama-onnx"
        cli = Path(sys.executable).parent / "optimum-cli"
        command = [str(cli), "export", "onnx", "--dynamo", "--model", str(checkpoint), str(output)]
        print("$", " ".join(command), flush=True)
        subprocess.run(command, check=True)

        tokenizer = AutoTokenizer.from_pretrained(output)
        ort_model = ORTModelForCausalLM.from_pretrained(output)
        torch_model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
        inputs = tokenizer([PROMPT], return_tensors="pt")
        inputs = {k: inputs[k] for k in ("input_ids", "attention_mask")}
        tokens = ort_model.generate(**inputs, max_new_tokens=12, do_sample=False, pad_token_id=0)
        expected = torch_model.generate(**inputs, max_new_tokens=12, do_sample=False, pad_token_id=0)
        with torch.no_grad():
            diff = (ort_model(**inputs).logits - torch_model(**inputs).logits).abs().max().item()

        print(f"\nfiles:     {', '.join(sorted(p.name for p in output.iterdir()))}")
        print(f"exporter:  {read_manifest(output)['exporter']}")
        print(f"prompt:    {PROMPT!r}")
        print(f"generated: {tokenizer.decode(tokens[0], skip_special_tokens=True)!r}  (random weights)")
        print(f"greedy tokens equal PyTorch's: {torch.equal(tokens, expected)}")
        print(f"max |ORT - PyTorch| logits: {diff:.3e}")
        return 0 if torch.equal(tokens, expected) and diff < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
