"""The selective scan of the Mamba-1 mixers (mamba, falcon_mamba, jamba, zamba) over a whole sequence.

transformers 5.15+ factors it into `mamba_selective_scan`, whose torch path loops over the length in Python:
torch.export unrolls the loop at the capture's length, which fixes the sequence axis of every call that is not
one token onto a state (feature extraction, sequence classification). The replacement runs the same recurrence
with `torch.scan` (imported from `torch._higher_order_ops`, as torch's control-flow docs do), which torch.export
keeps as one op and torch.onnx writes as an ONNX `Scan`: same discretization, same zero state. The mambapy and
associative-scan options compute the same recurrence; neither has an ONNX translation, so they are not taken.

transformers 4 writes the loop inline in each mixer's `slow_forward`; those rows stay refused."""

import torch
import torch.nn.functional as F
from torch._higher_order_ops import scan

from .registry import register_patch

_MODELS = ("mamba", "falcon_mamba", "jamba", "zamba")


def _step(state, x):
    discrete_a, delta_b_u, c = x
    state = discrete_a * state + delta_b_u
    return state, (state * c.unsqueeze(1)).sum(-1)  # no matmul: its batch sizes would enter the body


def selective_scan(hidden_states, dt, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                   return_last_state=False, use_mambapy=False, use_associative_scan=False, **kwargs):
    input_dtype = hidden_states.dtype
    if delta_bias is not None:
        dt = dt + delta_bias.to(dt.dtype)[..., None]
    if delta_softplus:
        dt = F.softplus(dt)
    B, C = B.transpose(1, 2), C.transpose(1, 2)  # (batch, length, state)
    discrete_a = torch.exp(A[None, :, None, :] * dt[:, :, :, None])  # (batch, channels, length, state)
    delta_b_u = dt[:, :, :, None] * B[:, None, :, :].float() * hidden_states[:, :, :, None].float()
    state = torch.zeros_like(delta_b_u[:, :, 0])
    state, outputs = scan(_step, state, (discrete_a.movedim(2, 0), delta_b_u.movedim(2, 0),
                                         C.to(delta_b_u.dtype).movedim(1, 0)))
    output = outputs.movedim(0, -1).to(input_dtype)
    if D is not None:
        output = output + hidden_states * D[None, :, None]
    if z is not None:
        output = output * F.silu(z)
    return (output, state) if return_last_state else output


for _model in _MODELS:
    register_patch(f"transformers.models.{_model}.modeling_{_model}.mamba_selective_scan",
                   versions={"transformers": ">=5.15"},
                   reason="the scan's Python loop over the length -> torch.scan (an ONNX Scan)")(selective_scan)
