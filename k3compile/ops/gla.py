"""fla.ops.gla, compiled by k3compile (Gated Linear Attention: a channel gate, no delta rule).
Same signatures as fla-core 0.6.0; docs/fla-compat.md maps every keyword. chunk_* is differentiable.

Key dims beyond what a kernel holds (KEY_BLOCK) run in key blocks: without the delta rule no
term couples two key channels (S <- Diag(a_t) S + k_t v_t^T decays and fills each key row of the
state on its own, and o_t = S^T q_t is a sum over key rows), so a GLA of K keys is the sum of the
outputs of GLAs on its key blocks, with the same v and scale, and its state their key rows
stacked. tests/test_prove.py checks the identity in exact arithmetic against the token recurrence
(and that it fails with the delta rule, where v - S^T k reads every key row).
"""

from __future__ import annotations

import torch

from k3compile.ops.calls import (check_keywords, check_varlen, described, entry_inputs, forward_only, fp32_state,
                                 head_dims, reject, require_fp32_state, reversed_in_time, run, run_recurrent,
                                 state_layout, state_v_first_of, wants_grad)
from k3compile.ops.layers import LayerKey

__all__ = ["chunk_gla", "fused_recurrent_gla"]

# the most keys a kernel holds: backends/triton/limits.py's MAX_HEAD_K_DIM (tests check they agree),
# not imported from there, which would import xDSL into every process that imports k3compile.ops
KEY_BLOCK = 256


def key_blocks(K: int, most: int = KEY_BLOCK) -> list[slice]:
    """The fewest equal blocks (the last possibly narrower) of at most `most` key channels."""
    count = -(-K // most)
    width = -(-K // count)
    return [slice(start, min(start + width, K)) for start in range(0, K, width)]


def over_key_blocks(run_block, q, k, v, g, initial_state, state_v_first: bool, output_final_state: bool):
    """(o, final_state) of a GLA too wide for one kernel: run_block(q_b, k_b, g_b, h0_b) on each key
    block, the outputs summed in fp32, the final states' key rows stacked. Each block's o comes
    rounded to the input dtype before the sum (fla's chunk_gla sums its key blocks inside a kernel).
    The shapes are checked whole first, so that an error names the caller's tensors."""
    HV, V, K = v.shape[2], v.shape[3], q.shape[3]
    for name, x in (("k", k), ("g", g)):
        if not isinstance(x, torch.Tensor) or x.dim() != 4 or tuple(x.shape) != (*q.shape[:2], x.shape[2], K):
            raise ValueError(f"{name}: expected [B, T, heads, K = {K}] like q {list(q.shape)}, got {described(x)}")
    if initial_state is not None:
        state = (HV, V, K) if state_v_first else (HV, K, V)
        if not isinstance(initial_state, torch.Tensor) or initial_state.dim() != 4 or \
                tuple(initial_state.shape[1:]) != state:
            raise ValueError(f"initial_state: expected [N, {', '.join(map(str, state))}], "
                             f"got {described(initial_state)}")
    outputs, states = [], []
    for block in key_blocks(K):
        rows = (..., block) if state_v_first else (..., block, slice(None))
        h0 = None if initial_state is None else initial_state[rows]
        o, final_state = run_block(q[..., block], k[..., block], g[..., block], h0)
        outputs.append(o)
        states.append(final_state)
    o = torch.stack([x.float() for x in outputs]).sum(0).to(outputs[0].dtype)
    return o, (torch.cat(states, dim=-1 if state_v_first else -2) if output_final_state else None)


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
    if K > KEY_BLOCK:
        return over_key_blocks(
            lambda q_b, k_b, g_b, h0_b: chunk_gla(q_b, k_b, v, g_b, scale=K ** -0.5 if scale is None else scale,
                                                  initial_state=h0_b, output_final_state=output_final_state,
                                                  state_v_first=state_v_first, cu_seqlens=cu_seqlens,
                                                  cu_seqlens_cpu=cu_seqlens_cpu),
            q, k, v, g, initial_state, state_v_first, bool(output_final_state))
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
    if K > KEY_BLOCK:
        return over_key_blocks(
            lambda q_b, k_b, g_b, h0_b: fused_recurrent_gla(
                q_b, k_b, v, g_b, scale=K ** -0.5 if scale is None else scale, initial_state=h0_b,
                output_final_state=output_final_state, reverse=reverse, state_v_first=state_v_first,
                cu_seqlens=cu_seqlens),
            q, k, v, gk, initial_state, state_v_first, bool(output_final_state))
    if reverse:
        q, k, v, gk = (reversed_in_time(x, cu_seqlens) for x in (q, k, v, gk))
    key = LayerKey("gla", H, HV, K, V, state_layout(state_v_first))
    o, final_state = run_recurrent(key, entry_inputs(key, q, k, v, gk, None), scale=scale,
                                   initial_state=initial_state, output_final_state=bool(output_final_state),
                                   cu_seqlens=cu_seqlens)
    return (reversed_in_time(o, cu_seqlens) if reverse else o), final_state
