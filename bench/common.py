"""Helpers shared by the GPU benchmark scripts (bench/recurrent_gpu.py, bench/chunk_gpu.py).

Standalone like the scripts: needs torch (passed in, so that importing this module imports
nothing heavy and TRITON_INTERPRET can still be set first), never k3compile or xDSL.
The scripts import it as `common` from their own folder.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import re
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path


def ints(text):
    return [int(x) for x in text.split(",") if x.strip()]


def import_file(path: Path, name: str):
    """Import a generated module from its file (kept on disk: Triton reads the kernel source)."""
    module_name = f"bench_generated_{name}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def short_error(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}".replace("\n", " ").replace("|", "/")
    return text if len(text) <= 200 else text[:197] + "..."


def argument_shapes(entry) -> dict[str, list[str]]:
    """An entry's argument shapes, read from its generated docstring ("q: [B,T,32,128] float (input)")."""
    return {m[1]: m[2].split(",") for m in re.finditer(r"^\s+(\w+): \[([^\]]+)\]", entry.__doc__, re.MULTILINE)}


RECURRENCE_INPUT_DEFAULTS = {"qk_l2norm": "false", "gate_input": "log", "gate_lower_bound": "-5.0", "beta_input": "probability"}


def recurrence_options(module) -> dict[str, str]:
    """The attributes of the `k3.recurrence` op a generated module was compiled from, read from its
    docstring, the input options (gate_input, ...) filled in with their defaults where not printed."""
    found = re.search(r"k3\.recurrence @\w+ <([^>]*)>", module.__doc__ or "")
    if found is None:
        raise ValueError(f"{module.__file__}: no k3.recurrence op in its docstring (not a generated recurrence module?)")
    attributes = dict(item.split(" = ", 1) for item in found[1].split(", "))
    return {**RECURRENCE_INPUT_DEFAULTS, **attributes}


def import_fla(module: str, name: str):
    """`from <module> import <name>` for an fla op (e.g. "fla.ops.kda", "chunk_kda").

    Returns (function, fla-core version, note). `import fla` also imports fla.layers/fla.models
    (transformers); if that fails, the op module is loaded under a bare `fla` package that skips
    fla/__init__.py, and the note says so. Raises if fla or the op module itself is missing."""
    bare = getattr(sys.modules.get("fla"), "_bench_bare_package", False)
    if not bare:
        try:
            import fla

            return getattr(importlib.import_module(module), name), getattr(fla, "__version__", "?"), None
        except ModuleNotFoundError as err:
            parts = module.split(".")
            if err.name in {".".join(parts[: i + 1]) for i in range(len(parts))}:
                raise
            first = short_error(err)
        except ImportError as err:
            first = short_error(err)
        for loaded in [m for m in sys.modules if m == "fla" or m.startswith("fla.")]:
            del sys.modules[loaded]
        spec = importlib.util.find_spec("fla")
        package = types.ModuleType("fla")
        package.__path__ = list(spec.submodule_search_locations)
        package.__file__ = spec.origin
        package.__version__ = importlib.metadata.version("fla-core")
        package._bench_bare_package = True
        package._bench_import_error = first
        sys.modules["fla"] = package
    package = sys.modules["fla"]
    note = f"`import fla` failed ({package._bench_import_error}); loaded {module} without fla/__init__"
    return getattr(importlib.import_module(module), name), package.__version__, note


def make_inputs(torch, B, T, H, HV, K, V, device, seed, gate="channel", beta=True, dtype=None, gate_floor=-5.0,
                gate_scale=1.0):
    """Random inputs in fla's layouts: q, k L2-normalised over K; v; g fp32 gate_scale *
    logsigmoid(randn) clamped at gate_floor (None: not clamped), [B,T,HV,K] (gate="channel"), [B,T,HV]
    (gate="scalar") or absent (gate=None); beta sigmoid(randn) [B,T,HV] or None; initial_state
    randn*0.1 fp32. q, k, v, beta in `dtype` (default bf16). With the defaults the draws (and so
    the tensors) are those recurrent_gpu.py always used; gate_floor changes no other tensor."""
    import torch.nn.functional as F

    dtype = dtype or torch.bfloat16

    gen = torch.Generator(device="cpu").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(device)

    q = F.normalize(randn(B, T, H, K), p=2, dim=-1).to(dtype)
    k = F.normalize(randn(B, T, H, K), p=2, dim=-1).to(dtype)
    v = randn(B, T, HV, V).to(dtype)
    gate_shape = {"channel": (B, T, HV, K), "scalar": (B, T, HV), None: None}[gate]
    g = gate_scale * F.logsigmoid(randn(*gate_shape)) if gate_shape else None
    if g is not None:
        g = (g if gate_floor is None else g.clamp(min=gate_floor)).float().contiguous()
    b = torch.sigmoid(randn(B, T, HV)).to(dtype) if beta else None
    h0 = (randn(B, HV, K, V) * 0.1).float().contiguous()
    return dict(q=q, k=k, v=v, g=g, beta=b, initial_state=h0)


def reference(torch, inp, scale):
    """fp32 token recurrence: S <- Diag(exp g) S; then with beta (delta rule) u = beta (v - S^T k),
    S += k u^T, without beta S += k v^T; o = S^T (scale q). g is per channel [B,T,HV,K], a scalar
    per head [B,T,HV], or None (no decay)."""
    q, k, v, S = (inp[n].float() for n in ("q", "k", "v", "initial_state"))
    g = inp["g"].float() if inp.get("g") is not None else None
    beta = inp["beta"].float() if inp.get("beta") is not None else None
    B, T, H, K = q.shape
    HV = v.shape[2]
    if HV != H:
        q = q.repeat_interleave(HV // H, dim=2)
        k = k.repeat_interleave(HV // H, dim=2)
    S = S.clone()
    o = torch.empty(B, T, HV, v.shape[-1], dtype=torch.float32, device=q.device)
    for t in range(T):
        if g is not None:
            decay = g[:, t].exp()
            S = S * (decay[..., None] if decay.dim() == 3 else decay[..., None, None])
        if beta is not None:
            u = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhkv,bhk->bhv", S, k[:, t]))
        else:
            u = v[:, t]
        S = S + k[:, t, :, :, None] * u[:, :, None, :]
        o[:, t] = torch.einsum("bhkv,bhk->bhv", S, q[:, t] * scale)
    return o, S


def copy_bandwidth(torch, bench, mib: int, device="cuda") -> float:
    """Bytes read + written per second by a device copy of `mib` MiB of fp32, timed with `bench`
    (a callable's ms). The figure depends on the size (a copy that fits L2 runs faster, a small
    one pays its launch): each table states the buffer it used, and a kernel's fraction of it is
    best read against a copy of about the bytes the kernel moves."""
    src = torch.ones(mib * 2**20 // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    seconds = bench(lambda: dst.copy_(src)) * 1e-3
    return 2 * mib * 2**20 / seconds


def compare(torch, out, ref):
    """(max |out - ref|, ||out - ref|| / ||ref||) in fp32."""
    out, ref = out.float(), ref.float()
    diff = out - ref
    return float(diff.abs().max()), float(diff.norm() / ref.norm().clamp_min(1e-30))


def tensor_bytes(inp, names=("q", "k", "v", "g", "beta")):
    """Bytes of each input present (None-valued or missing ones are skipped)."""
    return {n: inp[n].numel() * inp[n].element_size() for n in names if inp.get(n) is not None}


def io_bytes(inp, B, T, HV, V, out_elem):
    """Minimal HBM traffic of one call: the fp32 state read + written, each input read once, o written."""
    state = 2 * B * HV * inp["initial_state"].shape[-2] * V * 4  # fp32 state read + write
    ins = sum(tensor_bytes(inp).values())
    outs = B * T * HV * V * out_elem
    return state + ins + outs


def cpu_time_ms(fn, reps):
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def wall_then_profile(torch, run, calls: int, warmup: int = 1):
    """Time `calls` calls of run() (after `warmup`), then profile as many: (wall seconds per call,
    the torch profiler with CPU and CUDA activities)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        run()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        run()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - start) / calls
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            run()
        torch.cuda.synchronize()
    return wall, prof


def fmt(x, digits=1, unit=""):
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    if x != 0 and (abs(x) < 10 ** (-digits) or abs(x) >= 1e6):
        return f"{x:.2e}{unit}"
    return f"{x:.{digits}f}{unit}"


def git_commit():
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10).stdout.strip() or None
    except Exception:  # noqa: BLE001
        return None


def device_name(torch, on_cpu):
    return "cpu (TRITON_INTERPRET=1)" if on_cpu else torch.cuda.get_device_name()


def kernel_times(torch, fn, iters: int = 5, short=lambda name: name) -> dict[str, float]:
    """GPU ms per call of each kernel fn launches (torch.profiler), by short(kernel name), the
    longest first."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    totals: dict[str, float] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            name = short(event.name)
            totals[name] = totals.get(name, 0.0) + event.device_time / iters / 1e3
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))
