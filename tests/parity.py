"""Shared checks: onnxruntime (through optimum's runtime classes) against PyTorch."""

import torch

PROMPTS = ["hello world", "the quick brown fox jumps over the lazy dog"]
ATOL = 1e-4


def padded_batch(tokenizer, prompts=PROMPTS):
    tokenizer.padding_side = "left"
    batch = tokenizer(prompts, return_tensors="pt", padding=True)
    assert (batch["attention_mask"] == 0).any(), "the batch must have a left-padded row"
    return {k: batch[k] for k in ("input_ids", "attention_mask")}


def greedy(model, inputs, new_tokens=8):
    return model.generate(**inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                          pad_token_id=0)


def assert_causal_lm_parity(ort_model, torch_model, inputs, atol=ATOL):
    """Identical greedy tokens and first-step logits within `atol` on non-padded positions."""
    with torch.no_grad():
        expected = torch_model(**inputs).logits
    got = ort_model(**inputs).logits
    keep = inputs["attention_mask"].bool()
    diff = (got[keep] - expected[keep]).abs().max().item()
    assert diff < atol, f"first-step logits differ by {diff:.3e} (atol {atol})"
    got_tokens, expected_tokens = greedy(ort_model, inputs), greedy(torch_model, inputs)
    assert torch.equal(got_tokens, expected_tokens), (
        f"greedy tokens differ (logits within {diff:.1e}): {got_tokens.tolist()} != {expected_tokens.tolist()}"
    )
    return diff
