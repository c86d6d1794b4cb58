"""sentence-transformers models (`--library-name sentence_transformers`): the model's modules in order, as one
forward from the transformer's inputs to what `SentenceTransformer.encode` returns.

The graph's outputs are optimum's for this library: `token_embeddings` (the transformer's last hidden states, after
any module that changes them) and `sentence_embedding` (after pooling, dense layers and normalization, as the model
declares them in its `modules.json`). optimum has no runtime class of its own for them: `ORTModelForCustomTasks` runs
the graph and returns both by name.
"""

from __future__ import annotations

import torch

# the transformer's inputs the graph may take, in this order (those its tokenizer makes)
INPUTS = ("input_ids", "attention_mask", "token_type_ids")


class SentenceEmbedder(torch.nn.Module):
    """A `SentenceTransformer` as a module whose forward takes tensors by name and returns both embeddings."""

    main_input_name = "input_ids"

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.config = model[0].auto_model.config

    @classmethod
    def from_pretrained(cls, model_id: str, config=None, trust_remote_code: bool = False, **hub_options):
        """The checkpoint's `SentenceTransformer` on the CPU (`config`: the transformer's, read from the same
        checkpoint). Other loading keywords are not taken: TypeError, never dropped."""
        from sentence_transformers import SentenceTransformer

        unknown = set(hub_options) - {"revision", "token", "cache_dir", "local_files_only"}
        if unknown:
            raise TypeError(f"SentenceEmbedder.from_pretrained takes no {', '.join(sorted(unknown))}")
        if "cache_dir" in hub_options:
            hub_options["cache_folder"] = hub_options.pop("cache_dir")
        return cls(SentenceTransformer(model_id, device="cpu", trust_remote_code=trust_remote_code, **hub_options))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None):
        features = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            features["token_type_ids"] = token_type_ids
        out = self.model(features)
        return {"token_embeddings": out["token_embeddings"], "sentence_embedding": out["sentence_embedding"]}


__all__ = ["INPUTS", "SentenceEmbedder"]
