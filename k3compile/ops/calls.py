"""What every k3compile.ops function shares: reading fla's arguments into a LayerKey, fla's own
checks (as one-line ValueErrors, never asserts), and running the compiled module's entries —
`chunk`, `recurrent`, or `decode` over a state pool — on contiguous inputs.
"""

from __future__ import annotations

import math
import warnings

import torch

from k3compile.ops.autograd import needs_grad, run_chunk
from k3compile.ops.layers import LayerKey, layer_module
from k3compile.ops.autotuning import tune_call, tuning_requested

IN_KERNEL_GATES = ("softplus", "bounded")  # gate inputs that take A_log and dt_bias

NO_BACKWARD = ("k3compile.ops differentiates the chunk_* functions, and fused_recurrent_* through them "
               "where a chunk function takes the same arguments (not over a state pool, nor with gv, nor a "
               "gated delta rule without gates: use fused_recurrent_delta_rule); call under torch.no_grad() / "
               "torch.inference_mode()")
SPECULATIVE = ("k3compile does not keep per-token state slots for speculative decoding: it replays "
               "(pipeline 'derive-replay,lower-speculative': verify, commit, spec_step; "
               "docs/speculative-decoding.md)")
NO_CUDA_GRAPH = ("k3compile's chunk entry reads cu_seqlens on the host, which a CUDA graph cannot "
                 "capture; the recurrent and decode entries can be captured")
NO_FLA_CP = ("k3compile does not take fla's FLACPContext; use the compiled layer's "
             "chunk(..., cp_group=group) (docs/context-parallel.md)")


def reject(name: str, why: str) -> None:
    raise NotImplementedError(f"{name}: {why}")


def check_keywords(function: str, kwargs: dict, read: tuple[str, ...]) -> None:
    """fla's **kwargs swallow any name; ours take only the keywords fla's function body reads
    (and the serving ones of its kernel-level form)."""
    for name in kwargs:
        if name not in read:
            raise TypeError(f"{function}() got an unexpected keyword argument '{name}' (besides its named "
                            f"parameters it takes {', '.join(read)}; fla would ignore '{name}' silently, "
                            f"k3compile.ops does not)")


def state_v_first_of(state_v_first: bool, kwargs: dict) -> bool:
    """state_v_first, or fla's deprecated alias transpose_state_layout (same warning as fla)."""
    if "transpose_state_layout" not in kwargs:
        return state_v_first
    if state_v_first:
        raise ValueError("Cannot pass both `state_v_first` and the deprecated `transpose_state_layout`.")
    warnings.warn("`transpose_state_layout` is deprecated and renamed to `state_v_first`.", DeprecationWarning,
                  stacklevel=3)
    return bool(kwargs["transpose_state_layout"])


def wants_grad(**tensors) -> bool:
    """A call autograd records: grad mode on and an input that requires grad. fused_recurrent_*
    then run the chunk function of the same arguments (the same function, and it has a backward)
    where one exists."""
    return torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in tensors.values())


def forward_only(**tensors) -> None:
    if torch.is_grad_enabled():
        for name, x in tensors.items():
            if isinstance(x, torch.Tensor) and x.requires_grad:
                raise NotImplementedError(f"{name} requires grad: {NO_BACKWARD}")


def described(x) -> str:
    """A value as an error message names it: a tensor's shape, else its type."""
    return str(list(x.shape)) if isinstance(x, torch.Tensor) else type(x).__name__


def head_dims(q, v) -> tuple[int, int, int, int]:
    """H, HV, K, V from q [B, T, H, K] and v [B, T, HV, V]; fla's GVA check."""
    for name, x, dims in (("q", q, "B, T, H, K"), ("v", v, "B, T, HV, V")):
        if not isinstance(x, torch.Tensor) or x.dim() != 4:
            raise ValueError(f"{name}: expected a tensor of shape [{dims}], got {described(x)}")
    H, K, HV, V = q.shape[2], q.shape[3], v.shape[2], v.shape[3]
    for name, x, dim, size in (("q", q, "H", H), ("q", q, "K", K), ("v", v, "HV", HV), ("v", v, "V", V)):
        if size == 0:
            raise ValueError(f"{name}: expected {dim} >= 1 (no zero-size heads), got {dim} = 0 in shape "
                             f"{list(x.shape)}")
    if HV % H:
        raise ValueError(f"For GVA, num_v_heads (HV={HV}) must be evenly divisible by num_heads (H={H}), "
                         f"but got HV % H = {HV % H}")
    return H, HV, K, V


def state_layout(state_v_first: bool) -> str:
    return "vk" if state_v_first else "kv"


def beta_input(use_beta_sigmoid_in_kernel: bool, allow_neg_eigval: bool) -> str:
    """beta as given, sigmoid(beta), or 2 sigmoid(beta) (fla's allow_neg_eigval)."""
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError("`allow_neg_eigval=True` requires `use_beta_sigmoid_in_kernel=True`.")
    if not use_beta_sigmoid_in_kernel:
        return "probability"
    return "logits_neg_eigval" if allow_neg_eigval else "logits"


def negative_bound(lower_bound) -> float:
    """lower_bound as the spec's gate_lower_bound: a finite log-decay bound below 0."""
    if isinstance(lower_bound, bool) or not isinstance(lower_bound, (int, float)) or not math.isfinite(lower_bound) \
            or lower_bound >= 0:
        raise ValueError(f"lower_bound: expected a finite number < 0 (a bound on the log-decay), got {lower_bound!r}")
    return float(lower_bound)


def no_gate_parameters(A_log, dt_bias) -> None:
    """fla drops A_log and dt_bias without an in-kernel gate; we say so instead."""
    for name, x in (("A_log", A_log), ("dt_bias", dt_bias)):
        if x is not None:
            raise ValueError(f"{name}: given with use_gate_in_kernel=False, where it has no effect (fla ignores "
                             f"it, k3compile.ops does not); pass use_gate_in_kernel=True or leave it out")


def gate_parameters(A_log, dt_bias, HV: int, width: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """A_log [HV] and dt_bias [HV * width] (width K: a channel gate, 1: a scalar gate) as the
    module takes them: None means exp(A_log) = 1 or no bias (zeros); fla reads any contiguous
    tensor of that many elements, so those are flattened."""
    A_log = torch.zeros(HV, dtype=torch.float32, device=device) if A_log is None else flat(A_log, HV)
    dt_bias = torch.zeros(HV * width, dtype=torch.float32, device=device) if dt_bias is None \
        else flat(dt_bias, HV * width)
    return A_log, dt_bias


def flat(x, numel: int):
    """x as a 1-D contiguous tensor when it has numel elements (else as given, for the module's
    shape error naming it)."""
    return x.contiguous().reshape(-1) if isinstance(x, torch.Tensor) and x.numel() == numel else x


def contiguous(x):
    return x.contiguous() if isinstance(x, torch.Tensor) else x


def fp32_state(initial_state):
    """fla's recurrent and chunked delta-rule kernels read any initial state as fp32."""
    if isinstance(initial_state, torch.Tensor) and initial_state.dtype != torch.float32:
        return initial_state.float()
    return initial_state


def require_fp32_state(function: str, initial_state) -> None:
    if isinstance(initial_state, torch.Tensor) and initial_state.dtype != torch.float32:
        raise ValueError(f"initial_state: must be float32 (fla's {function} asserts it), got {initial_state.dtype}")


def check_varlen(q, cu_seqlens, initial_state, cu_seqlens_cpu=None, pool: bool = False) -> None:
    """fla's varlen checks (B = 1; one initial state per sequence unless it is a state pool) and
    the host copy's: the same offsets, on the CPU."""
    if cu_seqlens is None:
        if cu_seqlens_cpu is not None:
            raise ValueError("cu_seqlens_cpu: given without cu_seqlens (it is a host copy of cu_seqlens)")
        return
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1:
        raise ValueError(f"cu_seqlens: expected a 1-D tensor of N + 1 offsets, got {described(cu_seqlens)}")
    if q.shape[0] != 1:
        raise ValueError(f"The batch size is expected to be 1 rather than {q.shape[0]} when using `cu_seqlens`. "
                         f"Please flatten variable-length inputs before processing.")
    if not pool and isinstance(initial_state, torch.Tensor) and initial_state.shape[0] != len(cu_seqlens) - 1:
        raise ValueError(f"The number of initial states is expected to be equal to the number of input sequences, "
                         f"i.e., {len(cu_seqlens) - 1} rather than {initial_state.shape[0]}.")
    if cu_seqlens_cpu is not None:
        if not isinstance(cu_seqlens_cpu, torch.Tensor) or cu_seqlens_cpu.device.type != "cpu" \
                or cu_seqlens_cpu.shape != cu_seqlens.shape:
            where = f" on {cu_seqlens_cpu.device}" if isinstance(cu_seqlens_cpu, torch.Tensor) else ""
            raise ValueError(f"cu_seqlens_cpu: expected a CPU tensor of cu_seqlens' shape {list(cu_seqlens.shape)}, "
                             f"got {described(cu_seqlens_cpu)}{where}")
        # the chunk entry reads cu_seqlens on the host anyway, so comparing costs no extra
        # synchronisation; under torch.compile the values are unknown, and then nothing reads the copy
        if not torch.compiler.is_compiling() and cu_seqlens_cpu.tolist() != cu_seqlens.tolist():
            raise ValueError(f"cu_seqlens_cpu: expected the values of cu_seqlens {cu_seqlens.tolist()} (its host "
                             f"copy), got {cu_seqlens_cpu.tolist()}")


def host_offsets(cu_seqlens, cu_seqlens_cpu=None) -> list[int]:
    """The offsets on the host: from the host copy when there is one (no device sync)."""
    return (cu_seqlens if cu_seqlens_cpu is None else cu_seqlens_cpu).tolist()


def check_chunk_size(function: str, chunk_size, allowed: tuple[int, ...]) -> int:
    if isinstance(chunk_size, bool) or chunk_size not in allowed:
        # fla's wording, which callers' tests match: "either 32 or 64", "16, 32, or 64"
        *first, last = map(str, allowed)
        choices = f"either {first[0]} or {last}" if len(first) == 1 else f"{', '.join(first)}, or {last}"
        raise ValueError(f"`chunk_size` must be {choices} for {function}, got {chunk_size!r}.")
    return chunk_size


def check_head_first(kwargs: dict) -> None:
    """fla's chunked delta-rule functions refuse head_first (removed there); [B, T, H, ...]
    inputs, head_first=False, are what we take anyway."""
    if kwargs.get("head_first", False):
        reject("head_first", "fla removed [B, H, T, ...] inputs; pass [B, T, H, ...] (x.transpose(1, 2))")


def entry_inputs(key: LayerKey, q, k, v, g, beta, A_log=None, dt_bias=None) -> dict:
    """The per-call tensors of an entry, contiguous (A_log, dt_bias only for the in-kernel gates).
    q, k and v must share a dtype: the compiled entry stores o and its workspaces in q's, where
    fla stores o in v's (g and beta may differ: fp32 gates beside bf16 inputs are common)."""
    dtypes = {name: x.dtype for name, x in dict(q=q, k=k, v=v).items() if isinstance(x, torch.Tensor)}
    if len(set(dtypes.values())) > 1:
        raise ValueError("q, k, v: expected one dtype, got " + ", ".join(f"{n} {d}" for n, d in dtypes.items())
                         + " (cast them to one)")
    tensors = dict(q=q, k=k, v=v, g=g, beta=beta)
    if key.gate_input in IN_KERNEL_GATES:
        tensors.update(A_log=A_log, dt_bias=dt_bias)
    return {name: contiguous(x) for name, x in tensors.items()}


def run(entry: str, key: LayerKey, tensors: dict, *, scale, save_forward: bool = False, **options):
    """Entry `chunk` or `recurrent` of the layer of `key` (scale None: fla's K ** -0.5); a chunk
    call with an input that requires grad, or under torch.compile, runs as the layer's custom op
    (its backward: the layer's chunk_backward; k3compile/ops/autograd.py), which with
    save_forward keeps the values the backward's first kernel would recompute. Inside
    k3compile.ops.tuning() a chunk call tunes its bucket first (k3compile/ops/autotuning.py)."""
    scale = key.head_k_dim ** -0.5 if scale is None else scale
    options = {name: contiguous(x) for name, x in options.items()}
    if entry == "chunk" and tuning_requested():  # opted in: k3compile.ops.tuning()
        tune_call(key, tensors, options.get("cu_seqlens"), needs_grad(options.get("initial_state"), *tensors.values()))
    if entry == "chunk" and "checkpoint_every" not in options and (
            needs_grad(options.get("initial_state"), *tensors.values()) or torch.compiler.is_compiling()):
        return run_chunk(key, tensors, scale=scale, save_forward=save_forward, **options)
    return getattr(layer_module(key), entry)(**tensors, scale=scale, **options)


def run_pool(key: LayerKey, tensors: dict, *, scale, pool, ssm_state_indices, cu_seqlens):
    """vLLM's continuous batching: sequence n starts from pool[ssm_state_indices[n]] and leaves
    its state there, in place (-1: a padding row, read as zeros and never written). The decode
    entry takes B rows of T tokens each, so a varlen batch runs as its non-empty sequences when
    they have one length (empty ones touch nothing, as in fla). Returns (o, pool)."""
    if not isinstance(pool, torch.Tensor):
        raise ValueError(f"ssm_state_indices: needs initial_state, the state pool [P, HV, K, V] it indexes, "
                         f"got {described(pool)}")
    if pool.dtype not in (torch.float32, torch.bfloat16) or not pool.is_contiguous():
        raise ValueError(f"initial_state: as the state pool of ssm_state_indices (updated in place), expected a "
                         f"contiguous float32 or bfloat16 tensor, got {pool.dtype}"
                         f"{'' if pool.is_contiguous() else ', not contiguous'}")
    if not isinstance(ssm_state_indices, torch.Tensor) or ssm_state_indices.dim() not in (1, 2):
        raise ValueError(f"ssm_state_indices: expected a 1-D tensor of pool rows, got {described(ssm_state_indices)}")
    if ssm_state_indices.dim() == 2:
        reject("ssm_state_indices", f"2-D per-token state slots: {SPECULATIVE}")
    scale = key.head_k_dim ** -0.5 if scale is None else scale
    decode = layer_module(key).decode
    if cu_seqlens is None:
        (o,) = decode(**tensors, scale=scale, state=pool, state_indices=ssm_state_indices)
        return o, pool
    T = tensors["q"].shape[1]
    bounds = host_offsets(cu_seqlens)
    if bounds[0] != 0 or bounds[-1] != T or any(b < a for a, b in zip(bounds, bounds[1:])):
        raise ValueError(f"cu_seqlens: expected non-decreasing offsets from 0 to T = {T}, got {bounds}")
    lengths = [end - start for start, end in zip(bounds, bounds[1:])]
    if tuple(ssm_state_indices.shape) != (len(lengths),):
        raise ValueError(f"ssm_state_indices: expected shape [{len(lengths)}] (one pool row per sequence of "
                         f"cu_seqlens), got {list(ssm_state_indices.shape)}")
    rows = [n for n, length in enumerate(lengths) if length]
    if len({lengths[n] for n in rows}) > 1:
        reject("cu_seqlens", f"the decode entry takes sequences of one length over a state pool, got lengths "
                             f"{lengths}; run each length as its own call")
    per_token = {name: x for name, x in tensors.items() if name not in ("A_log", "dt_bias") and x is not None}
    for name, x in per_token.items():
        if not isinstance(x, torch.Tensor) or x.dim() < 3 or x.shape[:2] != (1, T):
            raise ValueError(f"{name}: expected [1, T = {T}, ...] like q (varlen), got {described(x)}")
    length = lengths[rows[0]] if rows else 0
    batched = {**tensors, **{name: x.reshape(len(rows), length, *x.shape[2:]) for name, x in per_token.items()}}
    if len(rows) < len(lengths):
        ssm_state_indices = ssm_state_indices[torch.tensor(rows, dtype=torch.long, device=ssm_state_indices.device)]
    (o,) = decode(**batched, scale=scale, state=pool, state_indices=ssm_state_indices)
    return o.reshape(1, T, *o.shape[2:]), pool


def run_recurrent(key: LayerKey, tensors: dict, *, scale, initial_state, output_final_state, cu_seqlens,
                  ssm_state_indices=None, num_accepted_tokens=None):
    """The fused_recurrent_* functions: entry `recurrent` (an initial state of any dtype read as
    fp32, as fla's kernels do), or with ssm_state_indices `decode` over the pool initial_state."""
    if num_accepted_tokens is not None:
        reject("num_accepted_tokens", SPECULATIVE)
    if ssm_state_indices is not None:
        return run_pool(key, tensors, scale=scale, pool=initial_state, ssm_state_indices=ssm_state_indices,
                        cu_seqlens=cu_seqlens)
    return run("recurrent", key, tensors, scale=scale, initial_state=fp32_state(initial_state),
               output_final_state=output_final_state, cu_seqlens=cu_seqlens)


def states_at_chunk_starts(checkpoints, initial_state, lengths: list[int], chunk_size: int, varlen: bool, dtype):
    """fla's intermediate states h: the state at the start of every chunk of chunk_size tokens of
    every sequence — its initial state (zeros without one), then the states after each multiple
    of chunk_size (the chunk entry's checkpoints, [count, HV, ...] in sequence order, or
    [N, count, HV, ...]). [N, NT, HV, K, V] in dtype; varlen: [1, all chunks, HV, K, V]."""
    state_shape = checkpoints.shape[-3:]
    kept = checkpoints.reshape(-1, *state_shape)
    starts = torch.zeros(len(lengths), *state_shape, dtype=kept.dtype, device=kept.device) \
        if initial_state is None else initial_state.to(kept.dtype)
    rows, first = [], len(lengths)  # rows of cat([starts, kept])
    for n, length in enumerate(lengths):
        chunks = -(-length // chunk_size)
        if chunks:
            rows += [n, *range(first, first + chunks - 1)]
        first += length // chunk_size
    h = torch.cat([starts, kept])[torch.tensor(rows, dtype=torch.long, device=kept.device)].to(dtype)
    if varlen:
        return h[None]
    return h.reshape(len(lengths), -(-lengths[0] // chunk_size) if lengths else 0, *state_shape)


def reversed_in_time(x, cu_seqlens):
    """x [B, T, ...] with every sequence's tokens in reverse order (an involution); varlen: each
    sequence of cu_seqlens reversed in place, the index built on the device. Non-tensors pass
    through (the module's checks name them)."""
    if not isinstance(x, torch.Tensor):
        return x
    if cu_seqlens is None:
        return x.flip(1)
    offsets = cu_seqlens.to(device=x.device, dtype=torch.long)
    lengths = offsets[1:] - offsets[:-1]
    total = x.shape[1]
    if offsets.dim() != 1 or len(offsets) < 2 or offsets[0] != 0 or offsets[-1] != total or (lengths < 0).any():
        raise ValueError(f"cu_seqlens: expected non-decreasing offsets from 0 to T = {total}, got {offsets.tolist()}")
    sequence = torch.repeat_interleave(torch.arange(len(lengths), device=x.device), lengths, output_size=total)
    index = offsets[:-1][sequence] + offsets[1:][sequence] - 1 - torch.arange(total, device=x.device)
    return x.index_select(1, index)
