"""Encoder-decoder classifiers that pool at the last eos token, without data-dependent shapes.

On transformers 4, BART's sequence classifier and the ones copied from it (mBART, MVP, PLBart, BigBird-Pegasus,
LED, T5, mT5, UMT5) check that every row has as many eos tokens (`len(torch.unique_consecutive(...))`) and gather
them with a boolean index, whose size depends on the tokens: torch.export stops on both ("Could not guard on
data-dependent expression"). The patch runs the same model and head and takes each row's last eos position by
`argmax`, which is what the boolean index gives whenever every row has as many eos tokens (the case the original
accepts). Calls with labels or `return_dict=False` run the original. transformers 5 checks with `torch._check` and
exports as it is. (transformers 4.53 to 4.57.)"""

from __future__ import annotations

import torch

from .registry import original, register_patch

_MODELS = {"bart": "Bart", "mbart": "MBart", "mvp": "Mvp", "plbart": "PLBart", "bigbird_pegasus": "BigBirdPegasus",
           "led": "LED", "t5": "T5", "mt5": "MT5", "umt5": "UMT5"}
_TARGETS = [f"transformers.models.{name}.modeling_{name}.{prefix}ForSequenceClassification.forward"
            for name, prefix in _MODELS.items()]


def _pooled_at_last_eos(target: str):
    def eos_pooled_classification(self, input_ids=None, attention_mask=None, decoder_input_ids=None,
                                  decoder_attention_mask=None, head_mask=None, decoder_head_mask=None,
                                  cross_attn_head_mask=None, encoder_outputs=None, global_attention_mask=None,
                                  inputs_embeds=None, decoder_inputs_embeds=None, labels=None, use_cache=None,
                                  output_attentions=None, output_hidden_states=None, return_dict=None):
        kwargs = dict(decoder_input_ids=decoder_input_ids, decoder_attention_mask=decoder_attention_mask,
                      head_mask=head_mask, decoder_head_mask=decoder_head_mask,
                      cross_attn_head_mask=cross_attn_head_mask, encoder_outputs=encoder_outputs,
                      inputs_embeds=inputs_embeds, decoder_inputs_embeds=decoder_inputs_embeds, use_cache=use_cache,
                      output_attentions=output_attentions, output_hidden_states=output_hidden_states)
        if global_attention_mask is not None:  # LED's only
            kwargs["global_attention_mask"] = global_attention_mask
        if labels is not None or return_dict is False or input_ids is None:
            return original(target)(self, input_ids=input_ids, attention_mask=attention_mask, labels=labels,
                                    return_dict=return_dict, **kwargs)
        if decoder_input_ids is None and decoder_inputs_embeds is None and hasattr(self, "_shift_right"):
            kwargs["decoder_input_ids"] = self._shift_right(input_ids)  # the T5 family shifts here, BART's model itself
        outputs = self.base_model(input_ids, attention_mask=attention_mask, return_dict=True, **kwargs)
        hidden = outputs[0]
        eos = input_ids.eq(self.config.eos_token_id).to(hidden.device)
        positions = torch.arange(1, eos.shape[1] + 1, device=hidden.device)
        last = (eos.long() * positions).argmax(-1)  # each row's last eos
        logits = self.classification_head(hidden[torch.arange(hidden.shape[0], device=hidden.device), last])
        from transformers.modeling_outputs import Seq2SeqSequenceClassifierOutput

        return Seq2SeqSequenceClassifierOutput(
            logits=logits, past_key_values=outputs.past_key_values, decoder_hidden_states=outputs.decoder_hidden_states,
            decoder_attentions=outputs.decoder_attentions, cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states, encoder_attentions=outputs.encoder_attentions)

    return eos_pooled_classification


for _target in _TARGETS:
    register_patch(_target, versions={"transformers": ">=4.53,<5"}, check_signature=False,
                   reason="each row's last eos by argmax, not a data-dependent boolean index")(_pooled_at_last_eos(_target))
