"""Executable reference semantics of the `k3` ops: plain torch, float64, on the CPU.

This is the oracle every generated kernel is verified against. It is written from the
definitions (token-by-token recurrence, unfused AttnRes with materialised RMSNorm keys,
dense per-expert MoE loop) and shares no code with the kernels or the schedules.
Arguments follow the conventions of the compiled module (fla's layouts).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

f64 = torch.float64


def _sequences(batch: int, length: int, cu_seqlens: torch.Tensor | None):
    """(batch index, start, end) of every sequence."""
    if cu_seqlens is None:
        return [(b, 0, length) for b in range(batch)]
    bounds = cu_seqlens.tolist()
    return [(0, bounds[n], bounds[n + 1]) for n in range(len(bounds) - 1)]


def recurrence_inputs(op, q, k, g, beta, A_log=None, dt_bias=None):
    """What the inputs mean (the op's qk_l2norm, gate_input, beta_input), in float64:
    returns q, k, the log-decay g and beta as the recurrence uses them, on q's device."""
    device = q.device
    q, k = q.to(f64), k.to(device, f64)
    if op.input_option("qk_l2norm"):
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    if g is not None:
        g = g.to(device, f64)
        form = op.input_option("gate_input")
        if form == "clamped":
            g = g.clamp(min=op.input_option("gate_lower_bound"))
        elif form != "log":
            HV = g.shape[2]
            a = torch.exp(A_log.to(device, f64))
            bias = dt_bias.to(device, f64)
            if op.gate.data == "channel":
                a, bias = a[:, None], bias.reshape(HV, -1)
            if form == "softplus":
                g = -a * F.softplus(g + bias)
            else:
                g = op.input_option("gate_lower_bound") * torch.sigmoid(a * (g + bias))
    if beta is not None:
        beta = beta.to(device, f64)
        form = op.input_option("beta_input")
        if form == "logits":
            beta = torch.sigmoid(beta)
        elif form == "logits_neg_eigval":
            beta = 2 * torch.sigmoid(beta)
    return q, k, g, beta


def recurrence(op, q, k, v, g=None, beta=None, scale=None, initial_state=None,
               output_final_state=False, cu_seqlens=None, A_log=None, dt_bias=None, checkpoint_every=None):
    """Token-by-token k3.recurrence. Returns (o [B,T,HV,V] float64, final_state [N,HV,K,V] or None),
    and with checkpoint_every the states after every that many tokens of each sequence, stacked
    in sequence order ([count, HV, K, V]). Computed on q's device (a GPU's float64 is as exact and
    far faster than a CPU's for the verification grid), returned on the CPU."""
    gate = op.gate.data
    delta_rule = bool(op.delta_rule.value.data)
    layout = op.state_layout.data
    scale = op.scale.value.data if scale is None else scale
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    group = HV // H
    q, k, g, beta = recurrence_inputs(op, q, k, g, beta, A_log, dt_bias)
    device = q.device
    v = v.to(device, f64)
    q = q.repeat_interleave(group, dim=2)
    k = k.repeat_interleave(group, dim=2)
    o = torch.zeros(B, T, HV, V, dtype=f64, device=device)
    finals, checkpoints = [], []
    for n, (b, start, end) in enumerate(_sequences(B, T, cu_seqlens)):
        if initial_state is None:
            S = torch.zeros(HV, K, V, dtype=f64, device=device)
        else:
            S = initial_state[n].to(device, f64)
            S = S.transpose(-1, -2).clone() if layout == "vk" else S.clone()
        for t in range(start, end):
            if gate == "channel":
                S = torch.exp(g[b, t])[:, :, None] * S
            elif gate == "scalar":
                S = torch.exp(g[b, t])[:, None, None] * S
            if delta_rule:
                u = beta[b, t][:, None] * (v[b, t] - torch.einsum("hkv,hk->hv", S, k[b, t]))
            else:
                u = v[b, t]
            S = S + k[b, t][:, :, None] * u[:, None, :]
            o[b, t] = torch.einsum("hkv,hk->hv", S, scale * q[b, t])
            if checkpoint_every and (t + 1 - start) % checkpoint_every == 0:
                checkpoints.append(S.transpose(-1, -2) if layout == "vk" else S)
        finals.append(S.transpose(-1, -2) if layout == "vk" else S)
    final_state = torch.stack(finals).cpu() if output_final_state else None
    if checkpoint_every:
        kept = torch.stack(checkpoints) if checkpoints else torch.zeros(0, *S.shape, dtype=f64)
        return o.cpu(), final_state, kept.cpu()
    return o.cpu(), final_state



# --- segment summaries: the oracle of context parallelism ---------------------------------------
# A segment of tokens maps the state before it to the state after it: S_end = M S_start + N per
# value head, M the product of its token transitions (I - beta k k^T) Diag(exp g) (Diag(exp g)
# without the delta rule) and N its state from a zero start. M is held as the op allows: a
# [K, K] matrix with the delta rule, else the [K] diagonal (channel gate), a number (scalar
# gate) or None (no gate). States (N included) are in the op's state layout; M acts on K.


def _transition_form(op) -> str:
    return "full" if op.delta_rule.value.data else {"channel": "diagonal", "scalar": "scalar", "none": "identity"}[op.gate.data]


def segment_summaries(op, k, v, g=None, beta=None, segments=None, cu_seqlens=None, A_log=None, dt_bias=None):
    """(M, N) of every segment, from the definition. `segments`: token offsets [P + 1] into
    the tokens of the batch laid end to end (b * T + t; varlen: the packed tokens of cu_seqlens),
    from 0 to their count, holding every sequence boundary (T, 2T, ... or cu_seqlens) so that a
    segment lies within one sequence. Returns M [P, HV, K, K] / [P, HV, K] / [P, HV] / None and
    N [P, HV, K, V] ([P, HV, V, K] for the vk layout), float64."""
    B, T, H, K = k.shape
    HV = v.shape[2]
    bounds = torch.as_tensor(segments).tolist()
    sequence_edges = set(cu_seqlens.tolist()) if cu_seqlens is not None else {b * T for b in range(B + 1)}
    if bounds != sorted(set(bounds)) or bounds[0] != 0 or bounds[-1] != B * T or not sequence_edges <= set(bounds):
        raise ValueError(f"segments must rise from 0 to {B * T} through every sequence boundary, got {bounds}")
    flat = lambda x: None if x is None else x.reshape(1, B * T, *x.shape[2:])  # noqa: E731
    # N: every segment as a sequence of its own from a zero state (q is not read by the state)
    _, N = recurrence(op, flat(k), flat(k), flat(v), g=flat(g), beta=flat(beta), cu_seqlens=torch.tensor(bounds),
                      output_final_state=True, A_log=A_log, dt_bias=dt_bias)
    form = _transition_form(op)
    if form == "identity":
        return None, N
    # M: the product of the token transitions, then held in the op's form
    _, k, g, beta = recurrence_inputs(op, flat(k), flat(k), flat(g), flat(beta), A_log, dt_bias)
    k = k[0].repeat_interleave(HV // H, dim=1)  # [tokens, HV, K]
    if op.gate.data == "none":
        log_decays = torch.zeros(B * T, HV, K, dtype=f64)
    else:
        log_decays = g[0] if op.gate.data == "channel" else g[0][:, :, None].expand(-1, -1, K)
    Ms = []
    for start, end in zip(bounds, bounds[1:]):
        M = torch.eye(K, dtype=f64).repeat(HV, 1, 1)
        for t in range(start, end):
            M = torch.exp(log_decays[t])[:, :, None] * M
            if form == "full":
                M = M - beta[0, t][:, None, None] * k[t][:, :, None] * torch.einsum("hk,hkj->hj", k[t], M)[:, None, :]
        Ms.append(M)
    M = torch.stack(Ms)
    return {"full": M, "diagonal": torch.diagonal(M, dim1=-2, dim2=-1), "scalar": M[..., 0, 0]}[form], N


def apply_summary(op, summary, state):
    """M S + N: the state after a segment from the state before it (batched over leading dims)."""
    M, N = summary
    form = _transition_form(op)
    vk = op.state_layout.data == "vk"  # a state is S^T: M S is S^T M^T
    if form == "full":
        moved = state @ M.transpose(-1, -2) if vk else M @ state
    elif form == "diagonal":
        moved = state * M[..., None, :] if vk else M[..., :, None] * state
    elif form == "scalar":
        moved = M[..., None, None] * state
    else:
        moved = state
    return moved + N


def combine_summaries(op, later, earlier):
    """(M2, N2) o (M1, N1) = (M2 M1, M2 N1 + N2): the summary of two consecutive segments."""
    M2, M1 = later[0], earlier[0]
    form = _transition_form(op)
    M = None if form == "identity" else M2 @ M1 if form == "full" else M2 * M1
    return M, apply_summary(op, later, earlier[1])


def attnres(op, sources, query, gain):
    """k3.attnres over sources [S, ..., D] -> [..., D] float64 (unfused: keys are materialised)."""
    eps = op.eps.value.data
    x = sources.to(f64).cpu()
    keys = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gain.to(f64).cpu()
    scores = keys @ query.to(f64).cpu()
    weights = torch.softmax(scores, dim=0)
    return (weights[..., None] * x).sum(0)


def attnres_block_partials(op, representatives, queries, gains):
    """Block AttnRes's phase 1: the softmax over a block's n completed representatives
    [n, ..., D] of each of its queries w_j with its gain g_j ([Q, D] each), kept in parts: per
    query and token the max m_j of the scores s_ij = w_j . (g_j * RMSNorm(b_i)), the normaliser
    z_j = sum_i exp(s_ij - m_j) and the numerator a_j = sum_i exp(s_ij - m_j) b_i. Returns
    (m [Q, ...], z [Q, ...], a [Q, ..., D]) float64 (keys materialised, as attnres)."""
    eps = op.eps.value.data
    x = representatives.to(f64).cpu()
    normalised = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    scores = torch.einsum("n...d,qd->qn...", normalised, queries.to(f64).cpu() * gains.to(f64).cpu())
    top = scores.amax(1)
    weights = torch.exp(scores - top[:, None])
    return top, weights.sum(1), torch.einsum("qn...,n...d->q...d", weights, x)


def attnres_normalised_partials(block_max, block_normaliser, block_numerator):
    """The partials (m, z, a) of attnres_block_partials in the normalised form: the log-sum-exp
    m + log z and the normalised mix a / z. attnres_block_merge takes them as (lse, 1, a / z)."""
    return block_max + torch.log(block_normaliser), block_numerator / block_normaliser[..., None]


def attnres_block_merge(op, block_max, block_normaliser, block_numerator, partial_sum, query, gain):
    """Block AttnRes's phase 2 at one aggregation point: its query's partials over the completed
    representatives (m, z [...], a [..., D], from attnres_block_partials) merged with the block's
    current partial sum x [..., D]: with s = w . (gain * RMSNorm(x)) and M = max(m, s),
    h = (a e^(m - M) + x e^(s - M)) / (z e^(m - M) + e^(s - M)). float64 [..., D]."""
    eps = op.eps.value.data
    x = partial_sum.to(f64).cpu()
    score = (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gain.to(f64).cpu()) @ query.to(f64).cpu()
    m = block_max.to(f64).cpu()
    top = torch.maximum(m, score)
    old, new = torch.exp(m - top), torch.exp(score - top)
    numerator = block_numerator.to(f64).cpu() * old[..., None] + x * new[..., None]
    return numerator / (block_normaliser.to(f64).cpu() * old + new)[..., None]


def glu(activation: str, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    if activation == "swiglu":
        return F.silu(gate) * up
    # SiTU-GLU: bounded gate and linear branch, |out| < 100
    return 4 * torch.tanh(gate / 4) * torch.sigmoid(gate) * 25 * torch.tanh(up / 25)


# the E2M1 code c (sign bit 3, exponent bits 1-2, mantissa bit 0) -> its value, from the
# definition: exponent 0 gives mantissa / 2 (subnormal), exponent e > 0 gives 2^(e-1) (1 + mantissa / 2)
_E2M1 = [(-1) ** (c >> 3) * ((c & 1) / 2 if not (c >> 1) & 3 else 2.0 ** (((c >> 1) & 3) - 1) * (1 + (c & 1) / 2))
         for c in range(16)]


def dequantize_mxfp4(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """MXFP4 weights in the compiled modules' layout -> float64 [..., in]: values [..., in / 2]
    uint8 (in each block of 32 inputs, byte j holds input j's E2M1 code in its low nibble and
    input j + 16's in its high nibble), scales [..., in / 32] uint8 (block b's E8M0 exponent s:
    its weights are the codes' values times 2^(s - 127); s = 255 is NaN)."""
    table = torch.tensor(_E2M1, dtype=f64, device=values.device)
    codes = values.to(torch.int64).reshape(*values.shape[:-1], -1, 16)  # [..., blocks, byte j]
    blocks = torch.cat([table[codes & 15], table[codes >> 4]], dim=-1)  # [..., blocks, input]
    exponent = scales.to(f64) - 127
    scale = torch.where(scales == 255, torch.nan, torch.pow(2.0, exponent))
    return (blocks * scale[..., None]).reshape(*values.shape[:-1], -1)


def _expert(activation, x, gate_up, down):
    gate, up = (x @ gate_up.T).chunk(2, dim=-1)
    return glu(activation, gate, up) @ down.T


ROUTING_SUM_EPS = 1e-20  # added to the top-k sum that normalises the routing weights


def latent_moe_routing(op, x, router_weight, router_bias):
    """The router of k3.latent_moe on tokens x [R, d] -> (ids [R, k] int64, weights [R, k]
    float64), on x's device: s = sigmoid(x W_r^T); ids the top_k experts by s + bias in
    decreasing order, equal values ranking the lower expert id first (a stable sort); weights the
    unbiased s of those experts, normalised over the top_k if norm_topk_prob (the sum plus 1e-20,
    as DeepSeek-V3's router: a token whose chosen scores all underflow to 0 gets zero weights, not
    0/0), times routed_scaling_factor."""
    x, router_weight, router_bias = (t.to(x.device, f64) for t in (x, router_weight, router_bias))
    scores = torch.sigmoid(x @ router_weight.T)
    ranked = torch.sort(scores + router_bias, dim=-1, descending=True, stable=True).indices
    ids = ranked[:, :op.top_k.value.data]
    weights = scores.gather(-1, ids)
    if op.norm_topk_prob.value.data:
        weights = weights / (weights.sum(-1, keepdim=True) + ROUTING_SUM_EPS)
    return ids, weights * op.routed_scaling_factor.value.data


def latent_moe(op, x, router_weight, router_bias, expert_gate_up=None, expert_down=None,
               latent_down=None, latent_up=None, latent_norm_gain=None,
               shared_gate_up=None, shared_down=None, expert_gate_up_packed=None, expert_gate_up_scales=None,
               expert_down_packed=None, expert_down_scales=None):
    """k3.latent_moe on tokens x [R, d] -> [R, d] float64 on x's device, one expert at a time
    (each over the rows routed to it; a weight is taken to float64 one expert at a time).

    expert_gate_up [E, 2F, w] (gate rows first), expert_down [E, w, F] with w the latent width
    (or d); latent_down [l, d], latent_up [d, l], latent_norm_gain [l];
    shared_gate_up [Ns, 2Fs, d], shared_down [Ns, d, Fs]. MXFP4 expert weights come as each
    one's packed values and scales instead (expert_gate_up_packed, expert_gate_up_scales, ...:
    dequantize_mxfp4's layout), as the compiled entries of an mxfp4 layer take them.
    """
    to64 = lambda t: t.to(x.device, f64)  # noqa: E731

    def expert_weights(e):
        """Expert e's gate_up and down weights in float64: as given, or dequantised from MXFP4."""
        if expert_gate_up is None:
            return (to64(dequantize_mxfp4(expert_gate_up_packed[e], expert_gate_up_scales[e])),
                    to64(dequantize_mxfp4(expert_down_packed[e], expert_down_scales[e])))
        return to64(expert_gate_up[e]), to64(expert_down[e])

    chosen, weights = latent_moe_routing(op, x, router_weight, router_bias)
    activation = op.activation.data
    latent = op.latent_dim.value.data > 0
    x = to64(x)
    h = x @ to64(latent_down).T if latent else x
    combined = torch.zeros_like(h)
    for e in torch.unique(chosen).tolist():
        rows, slots = torch.nonzero(chosen == e, as_tuple=True)
        part = _expert(activation, h[rows], *expert_weights(e))
        combined.index_add_(0, rows, weights[rows, slots, None] * part)
    if latent:
        eps = op.eps.value.data
        combined = combined / torch.sqrt(combined.pow(2).mean(-1, keepdim=True) + eps) * to64(latent_norm_gain)
        combined = combined @ to64(latent_up).T
    out = combined
    for s in range(op.num_shared_experts.value.data):
        out = out + _expert(activation, x, to64(shared_gate_up[s]), to64(shared_down[s]))
    return out
