"""The backward in windows of tokens, for sequences whose backward workspaces would not fit.

chunk_backward's workspaces grow with the tokens: at chunks of 16 the per-chunk state S and its
cotangent S_bar alone take 2 K V bytes per token and head in bf16, 64 GiB for one sequence of 1M
tokens at H16 (bench/RESULTS.md, "A million tokens"). The recurrence splits where its state
does (the associative decomposition context parallelism uses): the backward of tokens [a, b)
needs only the state entering a and the cotangent of the state leaving b. So the forward keeps
the states at every window's end (the chunk entry's checkpoint_every: [N, T // W, *state] in
fp32, a state per window), and the backward runs chunk_backward window by window from the last,
each window's dh0 the cotangent leaving the window before it. The workspaces are then one
window's; the gradients are the same sums in the same order within each window.

The window is a plan from the module's own tables (WORKSPACE_SHAPES, NC_CHUNK_SIZE) and the
memory free on the device: the whole sequence where chunk_backward's workspaces fit in half of
it, else the longest window that does. K3C_BACKWARD_WINDOW sets it instead: a number of tokens,
or `inputs`, the longest window whose workspaces take no more than the call's q, k, v and do
(which the backward holds anyway), so that they no longer dominate training's peak memory, and
no shorter than INPUTS_POLICY_LEAST_WINDOW.
"""

from __future__ import annotations

import math
import os

import torch

from k3compile.ops.layers import LayerKey, entry_shape, layer_module

# the inputs whose rows are tokens (sliced per window); the others (A_log, dt_bias) are
# parameters whose gradients add up over the windows
TOKEN_INPUTS = ("q", "k", "v", "g", "beta")
FREE_SHARE = 0.5  # of the device's free memory, for one window's workspaces
INPUTS_POLICY = "inputs"  # K3C_BACKWARD_WINDOW's value for windows no larger than q, k, v and do
# the inputs policy's shortest window: the per-chunk workspaces are a fixed multiple of the
# inputs per token (S and S_bar alone 4x q, k, v and do at chunks of 16, K = V = 128), so the
# policy would cut any length; below a thousand tokens the windows' launches are not worth it
INPUTS_POLICY_LEAST_WINDOW = 1024


def window_multiple(module) -> int:
    """Window lengths must be whole chunks of the forward (its checkpoints) and of the backward."""
    sizes = module.NC_CHUNK_SIZE
    return math.lcm(sizes["chunk"], sizes["chunk_backward"])


def workspace_bytes(module, entry: str, sizes: dict[str, int], itemsize: int) -> int:
    """Bytes of `entry`'s workspaces at `sizes` (B, T, N), inputs of `itemsize`."""
    total = 0
    for pattern, dtype in module.WORKSPACE_SHAPES[entry].values():
        elements = math.prod(entry_shape(module, entry, pattern, sizes["B"], sizes["T"], sizes["N"]))
        total += elements * (itemsize if dtype == "float" else getattr(torch, dtype).itemsize)
    return total


def backward_window(batch: int, tokens: int, itemsize: int, device: str, varlen: bool, save_forward: bool,
                    *fields) -> int:
    """Tokens per window of the backward of the layer whose LayerKey has `fields` on `batch` sequences of
    `tokens` (0: all at once). Batched calls only: a window of packed varlen rows would cut
    sequences the checkpoints do not index, and the saving forward's values are per chunk of the
    whole sequence. Plain arguments (dynamo passes constants so), so that torch.compile takes the
    result as a constant."""
    module = layer_module(LayerKey(*fields))
    if varlen or save_forward or "chunk_backward" not in module.WORKSPACE_SHAPES:
        return 0
    multiple = window_multiple(module)
    forced = os.environ.get("K3C_BACKWARD_WINDOW")
    if forced and forced != INPUTS_POLICY:
        if not forced.isdigit() or int(forced) <= 0 or int(forced) % multiple:
            raise ValueError(f"K3C_BACKWARD_WINDOW: expected {INPUTS_POLICY!r} or a positive multiple of "
                             f"{multiple} tokens (the chunk sizes), got {forced!r}")
        window = int(forced)
    elif forced:
        key = LayerKey(*fields)
        per_token = 2 * (key.num_heads * key.head_k_dim + key.num_v_heads * key.head_v_dim) * itemsize
        window = fitting_window(module, batch, tokens, itemsize, batch * tokens * per_token)
        window = window and max(window, math.ceil(INPUTS_POLICY_LEAST_WINDOW / multiple) * multiple)
    elif not device.startswith("cuda"):
        return 0
    else:
        free = torch.cuda.mem_get_info(torch.device(device))[0]
        window = fitting_window(module, batch, tokens, itemsize, FREE_SHARE * free)
    return window if 0 < window < tokens else 0


def fitting_window(module, batch: int, tokens: int, itemsize: int, budget: float) -> int:
    """The longest window of whole chunks whose chunk_backward workspaces take at most `budget`
    bytes (0: the whole sequence fits)."""
    whole = workspace_bytes(module, "chunk_backward", {"B": batch, "T": tokens, "N": batch}, itemsize)
    if whole <= budget:
        return 0
    multiple = window_multiple(module)
    return max(int(budget / whole * tokens) // multiple * multiple, multiple)


# torch.compiler.assume_constant_result(backward_window), as k3compile.ops.autograd marks
# operator_name (the decorator imports torch._dynamo): traced, the plan is a constant of the graph
backward_window._dynamo_marked_constant = True


def windowed_backward(entry, given: dict, *, scale, initial_state, checkpoints, window: int, do, dht,
                      output_dh0: bool) -> list:
    """chunk_backward's results (each input's gradient in `given`'s order, then dh0) from calls on
    windows of `window` tokens, the last first; checkpoints[:, j] the state after (j + 1) window."""
    T = do.shape[1]
    starts = list(range(0, T, window))
    full: dict[str, torch.Tensor] = {}
    cotangent, dh0 = dht, None
    for index in reversed(range(len(starts))):
        rows = slice(starts[index], starts[index] + window)
        piece = {n: x[:, rows].contiguous() if n in TOKEN_INPUTS else x for n, x in given.items()}
        entering = initial_state if index == 0 else checkpoints[:, index - 1].contiguous()
        wants_dh0 = output_dh0 if index == 0 else True
        *grads, dh0 = entry(**piece, scale=scale, initial_state=entering, cu_seqlens=None,
                            do=do[:, rows].contiguous(), dht=cotangent, output_dh0=wants_dh0)
        for name, grad in zip(given, grads, strict=True):
            if name in TOKEN_INPUTS:
                if name not in full:
                    full[name] = grad.new_empty((grad.shape[0], T, *grad.shape[2:]))
                full[name][:, rows] = grad
            else:
                full[name] = grad if name not in full else full[name] + grad
        cotangent = dh0
    return [*(full[name] for name in given), dh0 if output_dh0 else None]
