"""Argument checks, allocation and launch helpers of the compiled modules: host code (and the
matrix-product helpers the chunked kernels call), generic over the entries, which call them with
the shape patterns of their IR. A real module, imported by the tests; the printer emits
everything below the marker into each compiled module, which may import only torch and triton.
"""

import os

import torch
import triton
import triton.language as tl

# --- emitted into every compiled module (above: what this file needs to be imported) ---

_FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

# Tests and `k3c verify` set this so that every output starts NaN-filled (integer outputs at
# their dtype's least value, never an index): an element a kernel fails to write can then never
# pass as a value. Off by default: the fill costs a full write.
POISON_OUTPUTS = os.environ.get("K3C_POISON_OUTPUTS") == "1"


def _alloc(shape, dtype, device):
    if POISON_OUTPUTS:
        poison = float("nan") if dtype.is_floating_point else torch.iinfo(dtype).min
        return torch.full(shape, poison, dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


def _bind(name, dim, size, dims):
    """Check one dimension of a shape pattern: numbers must match, symbols bind on first use."""
    if dim.isdigit():
        if size != int(dim):
            return f"size {int(dim)}"
        return None
    key = "N" if dim == "N+1" else dim
    value = size - 1 if dim == "N+1" else size
    if key in dims and dims[key] != value:
        return f"{dim} = {dims[key] + (1 if dim == 'N+1' else 0)} (from earlier arguments)"
    dims[key] = value
    return None


def _check_shape(name, x, shape, dims):
    """Raise ValueError naming `name` unless x's dims match the pattern `shape` (binding its
    symbols in dims)."""
    pattern = shape.split(",")
    if x.dim() != len(pattern):
        raise ValueError(f"{name}: expected shape [{shape}] ({len(pattern)} dims), got {list(x.shape)}")
    for axis, (dim, size) in enumerate(zip(pattern, x.shape)):
        problem = _bind(name, dim, size, dims)
        if problem:
            raise ValueError(f"{name}: dim {axis} of shape [{shape}] must be {problem}, got {list(x.shape)}")


def _check_tensor(name, x, shape, dtype_class, dims, device):
    """Raise ValueError naming `name` unless x is a contiguous tensor of the pattern `shape`."""
    if x is None:
        raise ValueError(f"{name}: required, got None")
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    _check_shape(name, x, shape, dims)
    allowed = {
        "float": _FLOAT_DTYPES,
        "float32": (torch.float32,),
        "offsets": (torch.int32, torch.int64),
        "state": (torch.float32, torch.bfloat16),
        "index": (torch.int32, torch.int64),
    }[dtype_class]
    if x.dtype not in allowed:
        raise ValueError(f"{name}: expected dtype {' or '.join(str(d) for d in allowed)}, got {x.dtype}")
    if device is not None and x.device != device:
        raise ValueError(f"{name}: expected a tensor on {device} (like the first argument), got {x.device}")
    if x.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"{name}: is on the CPU; run on a GPU, or set TRITON_INTERPRET=1 for Triton's interpreter")
    if not x.is_contiguous():
        raise ValueError(f"{name}: must be contiguous (call .contiguous() first)")


def _check_offsets(name, offsets, dims, device):
    """cu_seqlens: [N+1] integer offsets into the B*T tokens (B = 1), 0 first, non-decreasing."""
    if offsets is None:
        dims["N"] = dims["B"]
        return
    _check_tensor(name, offsets, "N+1", "offsets", dims, device)
    if dims["B"] != 1:
        raise ValueError(f"{name}: variable-length input needs batch size 1, got B = {dims['B']}")
    if dims["N"] < 1:
        raise ValueError(f"{name}: needs at least 2 offsets (one sequence), got {offsets.numel()}")
    values = offsets.tolist()
    if values[0] != 0 or values[-1] != dims["T"]:
        raise ValueError(f"{name}: must start at 0 and end at T = {dims['T']}, got {values[0]} .. {values[-1]}")
    if any(b < a for a, b in zip(values, values[1:])):
        raise ValueError(f"{name}: offsets must be non-decreasing, got {values}")


def _chunks(offsets, dims, chunk_size, device):
    """The number of chunks of all sequences and, for varlen input, each chunk's
    (sequence, first token) as an int32 [num_chunks, 2] table."""
    if offsets is None:
        return dims["B"] * triton.cdiv(dims["T"], chunk_size), None
    # the count from the host's offsets (the checks already read them); the table built on the
    # device, without a synchronisation (repeat_interleave is told its output size): host-side
    # table building cost 1 to 5 ms per call at 4096 chunks on the H200 machine
    bounds = offsets.tolist()
    total = sum(-(-(b - a) // chunk_size) for a, b in zip(bounds, bounds[1:]))
    offsets = offsets.to(device=device, dtype=torch.int64)
    starts = offsets[:-1]
    counts = (offsets[1:] - starts + chunk_size - 1) // chunk_size
    sequence = torch.repeat_interleave(torch.arange(len(counts), device=device), counts, output_size=total)
    index = torch.arange(total, device=device) - (torch.cumsum(counts, 0) - counts)[sequence]
    table = torch.stack([sequence, starts[sequence] + index * chunk_size], dim=1)
    return total, table.to(torch.int32)


# The precision of the chunked kernels' matrix products, by input dtype (their constexpr DOT):
# bf16 operands for bf16 inputs; tf32 for fp16 inputs (fp16's 10 mantissa bits with fp32's
# exponent range: a factored Gram operand spans up to e^80 of decay, far past fp16's 65504);
# exact fp32 for fp32 inputs. A kernel whose products must be fp32-accurate takes "tf32x3".
_DOT_OF_DTYPE = {torch.bfloat16: "bf16", torch.float16: "tf32", torch.float32: "ieee"}


@triton.jit
def _dot_operand(x, DOT: tl.constexpr):
    """x in the dtype _mm multiplies it in: bf16 for bf16 products, else fp32 (never fp16)."""
    if DOT == "bf16":
        return x.to(tl.bfloat16)
    else:
        return x.to(tl.float32)


@triton.jit
def _mm(a, b, DOT: tl.constexpr):
    """a @ b with fp32 accumulation at the precision DOT (see _DOT_OF_DTYPE)."""
    if DOT == "bf16":
        return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
    else:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=DOT)


@triton.jit
def _mm_accurate(a, b, DOT: tl.constexpr):
    """a @ b for fp32 intermediates (the triangular inverse): tf32 tensor cores next to bf16 data,
    whose rounding is coarser; DOT itself where it is at least as fine (tf32, ieee, tf32x3)."""
    if DOT == "bf16":
        return tl.dot(a, b, input_precision="tf32")
    else:
        return tl.dot(a, b, input_precision=DOT)


def _checkpoints(every, chunk_size, offsets, dims, state_shape, device):
    """The checkpoints tensor of a chunk entry and, for varlen input, each sequence's first slot."""
    if every is None:
        return None, None
    if isinstance(every, bool) or not isinstance(every, int) or every <= 0 or every % chunk_size:
        raise ValueError(f"checkpoint_every: expected a positive multiple of the chunk size {chunk_size}, got {every!r}")
    if offsets is None:
        return _alloc((dims["N"], dims["T"] // every, *state_shape), torch.float32, device), None
    bounds = offsets.tolist()
    counts = [(end - start) // every for start, end in zip(bounds, bounds[1:])]
    first_slots = [sum(counts[:n]) for n in range(len(counts))]
    checkpoints = _alloc((sum(counts), *state_shape), torch.float32, device)
    return checkpoints, torch.tensor(first_slots, dtype=torch.int32, device=device)


def _bucket(n):
    """The power-of-two bucket of a size (k3c tune tunes per bucket): the smallest 2**k >= n."""
    return 1 << max(int(n) - 1, 0).bit_length()


def _tuned_launch(table, kernel, dtype, dims, heads, default):
    """The launch config of `kernel` for this call: the tuned one of its bucket (input dtype,
    N*heads, tokens per sequence; see TUNED_* above the entry), else `default`."""
    if not table:
        return default
    tokens = dims["B"] * dims["T"] // max(dims["N"], 1)
    tuned = table.get((str(dtype).removeprefix("torch."), _bucket(dims["N"] * heads), _bucket(tokens)))
    return {**default, **tuned[kernel]} if tuned and kernel in tuned else default


def _scalar(name, x, default):
    """A number argument as a Python float (None: its default), or ValueError naming it."""
    if x is None:
        return default
    try:
        value = float(x)
    except (TypeError, ValueError, RuntimeError):  # RuntimeError: a tensor of more than one element
        value = None
    if value is None or isinstance(x, bool) or not abs(value) < float("inf"):  # also rejects NaN
        shown = repr(x) if isinstance(x, (str, int, float)) else type(x).__name__
        raise ValueError(f"{name}: expected a finite number, got {shown}")
    return value


def _host_checks(check, x):
    """Whether to run the checks that read a tensor on the host (a synchronisation): not with
    check_indices=False, nor while a CUDA graph is captured (no copy to the host is allowed then)."""
    return check and not (x.is_cuda and torch.cuda.is_current_stream_capturing())


def _check_slots(name, slots, pool_rows, check):
    """state_indices: each row's pool slot, 0..P-1, or -1 for a padding row; no slot twice (two
    programs would advance it at once). The kernels mask any other slot either way (nothing is
    read or written outside the pool), so check_indices=False only skips the host's reading."""
    if not _host_checks(check, slots):
        return
    values = slots.tolist()
    for row, slot in enumerate(values):
        if slot != -1 and not 0 <= slot < pool_rows:
            raise ValueError(f"{name}: row {row} is slot {slot}, outside the pool of {pool_rows} slots "
                             f"(0..{pool_rows - 1}; -1 marks a padding row)")
    seen = {}
    for row, slot in enumerate(values):
        if slot != -1 and slot in seen:
            raise ValueError(f"{name}: slot {slot} is in rows {seen[slot]} and {row}; a pool slot may be "
                             "advanced by one row per call")
        seen[slot] = row


def _check_counts(name, counts, most, check):
    """accepted: each row's accepted draft tokens, 0..most (the cache depth); the kernels clamp
    any other count, so a wrong one would pass silently."""
    if not _host_checks(check, counts):
        return
    for row, count in enumerate(counts.tolist()):
        if not 0 <= count <= most:
            raise ValueError(f"{name}: row {row} accepts {count} tokens; expected 0..{most} (the cache depth)")


def _check_grid_axis(name, sequences, heads):
    """One program per (sequence, value head) on grid axis 1, which CUDA caps at 65535."""
    if sequences * heads > 65535:
        raise ValueError(f"{name}: {sequences} sequences x {heads} value heads = {sequences * heads} programs on "
                         f"grid axis 1, above CUDA's 65535; at most {65535 // heads} sequences per call")


_SIDE_STREAMS = {}  # device -> the side stream its entries' overlapping launches run on


def _fork(device):
    """k3s.fork_streams: the device's side stream, made to wait for the current stream's work so
    far (None off the GPU: torch.cuda.stream(None) changes nothing, the launches run in order)."""
    if device.type != "cuda":
        return None
    side = _SIDE_STREAMS.get(device)
    if side is None:
        side = _SIDE_STREAMS[device] = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    return side


def _join(side):
    """k3s.join_streams: the current stream waits for the side stream's launches since the fork."""
    if side is not None:
        torch.cuda.current_stream(side.device).wait_stream(side)


def _refuse_grad(entry, instead, *tensors):
    """An entry with no backward, called where autograd would record it: its outputs would carry
    no grad_fn, and the inputs' producers would train on zero gradients without a word."""
    if torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in tensors):
        raise RuntimeError(f"{entry}: has no backward, and an input requires grad; {instead}")


def _check_none(name, x, why):
    if x is not None:
        raise ValueError(f"{name}: must be None ({why})")


def _check_distinct(name, x, other_name, other):
    """x and other (contiguous, checked) must not share memory: a kernel reads one while writing the other."""
    start, end = x.data_ptr(), x.data_ptr() + x.numel() * x.element_size()
    other_start = other.data_ptr()
    if start < other_start + other.numel() * other.element_size() and other_start < end:
        raise ValueError(f"{name}: must not overlap {other_name} in memory (pass the other buffer of the pair)")
