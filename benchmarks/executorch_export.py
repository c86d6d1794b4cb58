"""ExecuTorch export of tiny decoders: export wall time, largest logits difference on the captured calls,
and whether 12 greedy tokens from a 9-token prompt equal PyTorch's (on demand, not in the test suite).

    HF_HUB_OFFLINE=1 .venv-t5/bin/python benchmarks/executorch_export.py [model_type ...]
"""

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # tiny.py: tiny checkpoints

import torch
import transformers

from optimum_dynamo.exporters.executorch import export_executorch
from optimum_dynamo.runtime.executorch import PteCausalLM
from tiny import save_tiny_decoder

MODELS = {"llama": {}, "qwen2": {}, "phi3": {"sliding_window": 6}, "gemma2": {"sliding_window": 6}, "gpt2": {},
          "mistral": {"sliding_window": 6}}
PROMPT = [1, 5, 9, 13, 17, 21, 25, 29, 33]


def main(names):
    root = Path(tempfile.mkdtemp())
    print(f"transformers {transformers.__version__}")
    print("| model | export wall (s) | lowering (s) | max abs diff | greedy 12 = PyTorch |")
    print("|---|---|---|---|---|")
    for name in names:
        checkpoint = save_tiny_decoder(name, root / name, **MODELS[name])
        start = time.perf_counter()
        ctx = export_executorch(str(checkpoint), root / f"{name}-pte", max_seq_len=32)
        wall = time.perf_counter() - start
        model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint).eval()
        with torch.no_grad():
            expected = model.generate(torch.tensor([PROMPT]), do_sample=False, max_new_tokens=12)[0, 9:].tolist()
        same = PteCausalLM(root / f"{name}-pte").generate(PROMPT, max_new_tokens=12) == expected
        lowering = ctx.timings["lower to ExecuTorch (XNNPACK)"]
        print(f"| {name} | {wall:.1f} | {lowering:.1f} | {ctx.discrepancies[0].max_abs:.1e} | {same} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or list(MODELS))
