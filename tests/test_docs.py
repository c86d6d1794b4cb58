"""The Python examples in docs/ run as written."""

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_python_api_example_runs(capsys):
    text = (DOCS / "python-api.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "python-api.md has no python example"
    for block in blocks:
        exec(compile(block, "docs/python-api.md", "exec"), {})
    out = capsys.readouterr().out
    assert "calls recorded" in out and "past_sequence_length + sequence_length" in out
    assert "(3, 6, 128)" in out or "(3, 1, 128)" in out


def test_vlm_example_runs(capsys):
    text = (DOCS / "vlm.md").read_text()
    (block,) = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    exec(compile(block, "docs/vlm.md", "exec"), {})
    lines = capsys.readouterr().out.splitlines()  # torch.onnx prints its progress too
    rows = [line for line in lines if "calls, max abs diff" in line]
    assert [line.split(":")[0].strip() for line in rows] == [
        "vision_encoder", "multi_modal_projector", "embed_tokens", "decoder_model"
    ]
    assert lines[-1].endswith(" True")
