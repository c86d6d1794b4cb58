"""The Python examples in docs/ run as written."""

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"


def offline(block: str, hub_id: str, checkpoint: Path) -> str:
    """The example with a tiny local checkpoint in place of its hub id (the Hub is not reachable here)."""
    return block.replace(f'"{hub_id}"', repr(str(checkpoint)))


@pytest.mark.once("t4")
def test_python_api_example_runs(capsys, tmp_path):
    from tiny import save_tiny_decoder

    text = (DOCS / "python-api.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "python-api.md has no python example"
    checkpoint = save_tiny_decoder("llama", tmp_path / "tiny-llama")
    assert '"HuggingFaceTB/SmolLM2-135M"' in blocks[0]
    for block in blocks:
        exec(compile(offline(block, "HuggingFaceTB/SmolLM2-135M", checkpoint), "docs/python-api.md", "exec"), {})
    out = capsys.readouterr().out
    assert "calls recorded" in out and "past_sequence_length + sequence_length" in out
    assert "(3, 6, 128)" in out or "(3, 1, 128)" in out


@pytest.mark.once("t5")
def test_vlm_example_runs(capsys, tmp_path):
    from tiny import save_tiny_vlm

    text = (DOCS / "vlm.md").read_text()
    (block,) = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    checkpoint = save_tiny_vlm("llava", tmp_path / "tiny-llava")
    assert '"llava-hf/llava-interleave-qwen-0.5b-hf"' in block
    exec(compile(offline(block, "llava-hf/llava-interleave-qwen-0.5b-hf", checkpoint), "docs/vlm.md", "exec"), {})
    lines = capsys.readouterr().out.splitlines()  # torch.onnx prints its progress too
    rows = [line for line in lines if "calls, max abs diff" in line]
    assert [line.split(":")[0].strip() for line in rows] == [
        "vision_encoder", "multi_modal_projector", "embed_tokens", "decoder_model"
    ]
    assert lines[-1].endswith(" True")
