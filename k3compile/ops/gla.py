"""fla.ops.gla, compiled by k3compile (Gated Linear Attention: a channel gate, no delta rule).
Same signatures as fla-core 0.6.0; docs/fla-compat.md maps every keyword. chunk_* is differentiable.
"""

from __future__ import annotations

import torch

from k3compile.ops.calls import (check_keywords, check_varlen, entry_inputs, forward_only, fp32_state, head_dims,
                                 reject, require_fp32_state, reversed_in_time, run, run_recurrent, state_layout,
                                 state_v_first_of, wants_grad)
from k3compile.ops.layers import LayerKey

__all__ = ["chunk_gla", "fused_recurrent_gla"]


def chunk_gla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    scale: int | None = None,
    initial_state: torch.Tensor = None,
    output_final_state: bool = False,
    state_v_first: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    cu_seqlens_cpu: torch.LongTensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""GLA, chunkwise (prefill): the compiled layer's `chunk` entry.

    Args:
        q, k: [B, T, H, K]. v: [B, T, HV, V] (fla: HV = H; k3compile also takes grouped value
            heads). g: [B, T, HV, K], the log-decay (any value: no bound is assumed).
        scale: default K ** -0.5. initial_state: [N, HV, K, V] float32 (as fla asserts;
            [N, HV, V, K] with state_v_first). output_final_state: also return the final states.
        state_v_first: states as [V, K]. cu_seqlens: [N + 1] offsets (B = 1); cu_seqlens_cpu:
            its host copy (checked). fla takes no other keyword; neither do we.

    Returns:
        (o [B, T, HV, V] in the input dtype, final_state float32 or None).
    """
    check_varlen(q, cu_seqlens, initial_state, cu_seqlens_cpu)
    require_fp32_state("chunk_gla", initial_state)
    H, HV, K, V = head_dims(q, v)
    key = LayerKey("gla", H, HV, K, V, state_layout(state_v_first))
    return run("chunk", key, entry_inputs(key, q, k, v, g, None), scale=scale, initial_state=initial_state,
               output_final_state=bool(output_final_state), cu_seqlens=cu_seqlens)


def fused_recurrent_gla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gk: torch.Tensor | None = None,
    gv: torch.Tensor | None = None,
    scale: int | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    reverse: bool = False,
    state_v_first: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""GLA, token by token: the compiled layer's `recurrent` entry.

    Args:
        q, k: [B, T, H, K]. v: [B, T, HV, V]. gk: [B, T, HV, K] log-decay; None: no decay
            (zeros: exp(0) = 1, plain linear attention). gv: NotImplementedError (k3compile's
            recurrences have no decay over the value dimension).
        scale: default K ** -0.5. initial_state: [N, HV, K, V] ([N, HV, V, K] with state_v_first)
            of any float dtype, read as fp32. output_final_state: also return the final states.
        reverse: run every sequence from its last token to its first (the state enters at the
            end; o stays in token order): the forward recurrence on the time-reversed sequences.
        cu_seqlens: [N + 1] offsets (B = 1).
        **kwargs: transpose_state_layout (deprecated alias of state_v_first). Any other keyword
            is a TypeError.

    Returns:
        (o [B, T, HV, V] in the input dtype, final_state float32 or None).
    """
    check_keywords("fused_recurrent_gla", kwargs, ("transpose_state_layout",))
    state_v_first = state_v_first_of(state_v_first, kwargs)
    if wants_grad(q=q, k=k, v=v, gk=gk, initial_state=initial_state) and gv is None:
        # the recurrent entry has no backward: the chunk entry computes the same function and has one
        # (reverse: on the sequences reversed in time, differentiably, and its output reversed back)
        in_order = (lambda x: reversed_in_time(x, cu_seqlens)) if reverse else (lambda x: x)
        gate = q.new_zeros(*v.shape[:3], q.shape[-1]) if gk is None else gk
        o, final_state = chunk_gla(*(in_order(x) for x in (q, k, v, gate)), scale=scale,
                                   initial_state=fp32_state(initial_state), output_final_state=output_final_state,
                                   state_v_first=state_v_first, cu_seqlens=cu_seqlens)
        return in_order(o), final_state
    forward_only(q=q, k=k, v=v, gk=gk, gv=gv, initial_state=initial_state)
    if gv is not None:
        reject("gv", "k3compile's recurrences have no decay over the value dimension")
    check_varlen(q, cu_seqlens, initial_state)
    H, HV, K, V = head_dims(q, v)
    if gk is None:
        gk = q.new_zeros(*v.shape[:3], K)
    if reverse:
        q, k, v, gk = (reversed_in_time(x, cu_seqlens) for x in (q, k, v, gk))
    key = LayerKey("gla", H, HV, K, V, state_layout(state_v_first))
    o, final_state = run_recurrent(key, entry_inputs(key, q, k, v, gk, None), scale=scale,
                                   initial_state=initial_state, output_final_state=bool(output_final_state),
                                   cu_seqlens=cu_seqlens)
    return (reversed_in_time(o, cu_seqlens) if reverse else o), final_state
