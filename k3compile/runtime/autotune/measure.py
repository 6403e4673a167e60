"""Measuring one candidate: the GPU's name, the inputs of the reference check and of the target
shape, a call of the tuned entry with the candidate's launch config (chunk: o and the final
state; chunk_backward: every gradient and dh0, from do and dht), the check of its NaN-poisoned
outputs against the reference and of every output written at the target shape, the timer
(triton.testing.do_bench), and the parallel precompile of every candidate's kernels.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from k3compile.runtime.autotune.space import BACKWARD_ENTRY, TUNED_ENTRY, Candidate

DEFAULT_CHECK_SHAPE = None  # (B, T) of the reference check; None: check_shape_for(the target)
BENCH_WARMUP_MS, BENCH_REP_MS = 10, 40  # triton.testing.do_bench per candidate


def gpu_name() -> str | None:
    """The CUDA device's name, None without one."""
    # torch, triton: importing k3compile.runtime.autotune (k3compile.ops does) loads neither
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def check_shape_for(tokens: int) -> tuple[int, int]:
    """The reference check's (B, T): two sequences of several chunks of 64 and 32 and a partial
    one, T divisible by 16 exactly when the target's is (Triton specialises integer arguments
    on that), so the check and the timing share compiled kernels."""
    return (2, 1 if tokens == 1 else 144 if tokens % 16 == 0 else 150)


# --- inputs -----------------------------------------------------------------------------------


def timing_inputs(layer_op, batch: int, tokens: int, dtype, device: str, seed: int = 0) -> dict:
    """Random inputs of the target shape drawn on the device (fast at prefill sizes), with the
    meaning of k3compile.checking.verify.recurrence_inputs: unit q/k unless the kernel normalises, log
    decays clamped at -5 (or raw gate projections and the gate's parameters), beta in (0, 1) or
    logits, an fp32 initial state."""
    # torch, triton: importing k3compile.runtime.autotune (k3compile.ops does) loads neither
    import torch
    import torch.nn.functional as F

    H, HV = layer_op.num_heads.value.data, layer_op.num_v_heads.value.data
    K, V = layer_op.head_k_dim.value.data, layer_op.head_v_dim.value.data
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32)

    normalised = not layer_op.input_option("qk_l2norm")
    q, k = randn(batch, tokens, H, K), randn(batch, tokens, H, K)
    inputs = {"q": F.normalize(q, dim=-1) if normalised else q, "k": F.normalize(k, dim=-1) if normalised else k,
              "v": randn(batch, tokens, HV, V)}
    gate = layer_op.gate.data
    if gate != "none":
        shape = (batch, tokens, HV, K) if gate == "channel" else (batch, tokens, HV)
        if layer_op.input_option("gate_input") in ("softplus", "bounded"):
            inputs["g"] = randn(*shape)
            inputs["A_log"] = -0.5 + 0.3 * randn(HV)
            inputs["dt_bias"] = 0.5 * randn(HV * K if gate == "channel" else HV)
        else:
            lower = max(-5.0, layer_op.input_option("gate_lower_bound"))
            inputs["g"] = F.logsigmoid(randn(*shape)).clamp(min=lower)
    if layer_op.delta_rule.value.data:
        beta = randn(batch, tokens, HV)
        inputs["beta"] = beta if layer_op.input_option("beta_input") != "probability" else torch.sigmoid(beta)
    inputs = {name: x.to(dtype) for name, x in inputs.items()}
    state = (batch, HV, K, V) if layer_op.state_layout.data == "kv" else (batch, HV, V, K)
    inputs["initial_state"] = 0.5 * randn(*state)
    return inputs


def with_cotangents(layer_op, inputs: dict, seed: int = 1) -> dict:
    """The backward's inputs at the target shape: the forward's `inputs` (an initial state among
    them) plus random cotangents as a training step hands them to chunk_backward (k3compile.ops):
    do in o's layout and dtype, dht of the final state in fp32, drawn on the inputs' device."""
    # torch, triton: importing k3compile.runtime.autotune (k3compile.ops does) loads neither
    import torch

    v, state = inputs["v"], inputs["initial_state"]
    gen = torch.Generator(device=v.device).manual_seed(seed)
    do = torch.randn(*v.shape[:3], layer_op.head_v_dim.value.data, generator=gen, device=v.device,
                     dtype=torch.float32)
    dht = torch.randn(*state.shape, generator=gen, device=v.device, dtype=torch.float32)
    return {**inputs, "do": do.to(v.dtype), "dht": dht}


# --- running candidates -----------------------------------------------------------------------


class EveryBucket(dict):
    """A launch table that gives every bucket the same config (a candidate under test)."""

    def __init__(self, launch: dict) -> None:
        super().__init__()
        self.launch = launch

    def __bool__(self) -> bool:
        return True

    def get(self, key, default=None):
        return self.launch


def set_launch(module, launch: dict, entry_name: str = TUNED_ENTRY) -> None:
    # xDSL: k3compile.ops imports this package, and its warm start must not load xDSL
    from k3compile.backends.triton.printer import launch_table_name

    setattr(module, launch_table_name(entry_name), EveryBucket(launch))


def run_entry(module, inputs: dict, candidate: Candidate, entry_name: str = TUNED_ENTRY, **options):
    """One call of the tuned entry with the candidate's launch config set: (o, final_state).
    options: more arguments of the call (segments=P). Tests replace this to make a candidate wrong."""
    set_launch(module, candidate.launch, entry_name)
    return getattr(module, entry_name)(**inputs, output_final_state=True, **options)


def run_backward(module, inputs: dict, candidate: Candidate, entry_name: str = BACKWARD_ENTRY, **options) -> dict:
    """One call of the backward entry with the candidate's launch config, as k3compile.ops calls it
    in a training step with an initial state and a final state (do, dht, output_dh0=True): each
    gradient by name (dq, dk, ..., dh0). Tests replace this to make a candidate wrong."""
    # the checks import torch and xDSL, which importing this package must not
    from k3compile.checking.verify_backward import DIFFERENTIABLE

    set_launch(module, candidate.launch, entry_name)
    grads = getattr(module, entry_name)(**inputs, output_dh0=True, **options)
    names = [f"d{n}" for n in DIFFERENTIABLE if inputs.get(n) is not None] + ["dh0"]
    if len(grads) != len(names):
        raise ValueError(f"{entry_name} returned {len(grads)} values for {', '.join(names)}")
    return dict(zip(names, grads))


def entry_outputs(module, inputs: dict, candidate: Candidate, entry_name: str = TUNED_ENTRY, **options) -> dict:
    """The outputs of one call of the tuned entry by name: chunk's o and final_state (run_entry),
    chunk_backward's gradients (run_backward)."""
    if entry_name == BACKWARD_ENTRY:
        return run_backward(module, inputs, candidate, entry_name, **options)
    o, state = run_entry(module, inputs, candidate, entry_name, **options)
    return {"o": o, "final_state": state}


def time_candidate(fn: Callable[[], object], candidate: Candidate) -> float:
    """Milliseconds of fn on the GPU (median of triton.testing.do_bench)."""
    # torch, triton: importing k3compile.runtime.autotune (k3compile.ops does) loads neither
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=BENCH_WARMUP_MS, rep=BENCH_REP_MS, return_mode="median"))


def short(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    text = f"{type(err).__name__}: {lines[0] if lines else ''}"
    return text if len(text) <= 160 else text[:157] + "..."


def precompile(modules: list[tuple[object, list[Candidate]]], entry_name: str, input_sets: list[dict],
               jobs: int) -> None:
    """Compile the kernels of every candidate of every (module, its candidates) in parallel
    threads (Triton's AsyncCompileMode; LLVM and ptxas run without the GIL): the launches are
    replaced by warmups, so nothing runs. Errors are left for the real runs to report. GPU only."""
    # torch, triton: importing k3compile.runtime.autotune (k3compile.ops does) loads neither
    import triton

    class WarmupOnly:
        def __init__(self, kernel) -> None:
            self.kernel = kernel

        def __getitem__(self, grid):
            return lambda *args, **kwargs: self.kernel.warmup(*args, grid=grid, **kwargs)

    saved = [(module, module.POISON_OUTPUTS,
              {name: obj for name, obj in vars(module).items() if name.endswith("_kernel") and hasattr(obj, "warmup")})
             for module, _ in modules]
    try:
        for module, _, kernels in saved:
            module.POISON_OUTPUTS = False
            for name, kernel in kernels.items():
                setattr(module, name, WarmupOnly(kernel))
        with ThreadPoolExecutor(jobs) as pool, triton.AsyncCompileMode(pool, ignore_errors=True):
            for module, group in modules:
                for candidate in group:
                    for inputs in input_sets:
                        try:
                            entry_outputs(module, inputs, candidate, entry_name)
                        except Exception:  # noqa: BLE001, S110 - reported by the real run
                            pass
    finally:
        for module, poison, kernels in saved:
            for name, kernel in kernels.items():
                setattr(module, name, kernel)
            module.POISON_OUTPUTS = poison


def check_and_time(module, cand: Candidate, *, check: dict, reference: dict, target: dict, tol,
                   timer: Callable, phases: dict[str, float], entry_name: str = TUNED_ENTRY,
                   **options) -> tuple[str, float, str]:
    """(status, ms, detail) of one call of the entry (options: more arguments, segments=P):
    NaN-poisoned outputs checked against `reference` (output name -> the reference's, on the
    `check` inputs) within `tol` (one RMS ratio, or one per output name); every output written at
    the `target` inputs; only then timed there by timer(fn, candidate). Any error scores infinity
    (out of resources, launch errors). Adds its seconds to phases["check"] and phases["time"]."""
    # torch, triton: importing k3compile.runtime.autotune (k3compile.ops does) loads neither
    import torch

    # the checks import torch and xDSL, which importing this package must not
    from k3compile.checking.verify import compare

    t0 = time.perf_counter()
    try:
        module.POISON_OUTPUTS = True  # unwritten elements stay NaN and fail
        outputs = entry_outputs(module, check, cand, entry_name, **options)
        for name, ref in reference.items():
            limit = tol[name] if isinstance(tol, dict) else tol
            rms = compare(outputs[name], ref)[1]
            if not (math.isfinite(rms) and rms <= limit):
                return "wrong", math.inf, (f"{name}: NaN (unwritten elements or a blow-up)" if math.isnan(rms)
                                           else f"{name}: RMS ratio {rms:.1e} > {limit:.0e}")
        outputs = entry_outputs(module, target, cand, entry_name, **options)
        if not all(bool(torch.isfinite(out).all()) for out in outputs.values() if out is not None):
            return "unwritten", math.inf, "NaN in the outputs at the target shape"
    except Exception as err:  # noqa: BLE001
        return "error", math.inf, short(err)
    finally:
        phases["check"] += time.perf_counter() - t0
    t0 = time.perf_counter()
    try:
        module.POISON_OUTPUTS = False
        timed_as = replace(cand, options={**cand.options, **options})  # what the timer is told
        ms = float(timer(lambda: entry_outputs(module, target, cand, entry_name, **options), timed_as))
    except Exception as err:  # noqa: BLE001
        return "error", math.inf, short(err)
    finally:
        phases["time"] += time.perf_counter() - t0
    if math.isfinite(ms) and ms > 0:
        return "ok", ms, ""
    return "error", math.inf, f"timer returned {ms}"
