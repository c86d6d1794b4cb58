"""Caches made by a real forward, in whatever layout the installed transformers uses, survive a round trip:
same names, same tensors, and generation continues from the rebuilt cache with identical logits."""

import torch
import torch.utils._pytree as pytree
from transformers import AutoModelForCausalLM

from optimum_dynamo import flatten


def test_real_cache_round_trip_continues_generation(checkpoints):
    model = AutoModelForCausalLM.from_pretrained(checkpoints("llama")).eval()
    ids = torch.randint(3, 100, (2, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        cache = model(input_ids=ids, use_cache=True).past_key_values
        names, tensors, context = flatten.flatten_cache(cache)
        assert names == ["0.key", "0.value", "1.key", "1.value"]
        assert all(t.shape == (2, 2, 5, 8) for t in tensors)
        rebuilt = flatten.unflatten_cache(type(cache), context, [t.clone() for t in tensors])
        step = torch.tensor([[7], [9]])
        expected = model(input_ids=step, past_key_values=cache, use_cache=True).logits
        got = model(input_ids=step, past_key_values=rebuilt, use_cache=True).logits
    assert torch.equal(got, expected)
    with flatten.registered():
        leaves, spec = pytree.tree_flatten(flatten.clone_cache(rebuilt))
        assert len(leaves) == 4 and pytree.tree_unflatten(leaves, spec).get_seq_length() == 6
