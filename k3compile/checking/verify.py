"""Differential verification: compiled kernels against the float64 reference semantics.

Each case draws fresh random inputs (never zeros), runs the compiled entry with its outputs
NaN-filled (POISON_OUTPUTS, so an unwritten element fails), runs `k3compile.ir.reference` on the same
inputs in float64 on the CPU, and compares by max abs error and the RMS ratio
||out - ref|| / ||ref|| (the measure fla's tests use). A recurrence's `chunk_backward` cases
compare each gradient with float64 autograd of the reference (k3compile/checking/verify_backward.py).
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy
import torch
import torch.nn.functional as F

from k3compile.checking.verify_attnres import (AttnResCase, attnres_cases, attnres_tolerance, quick_attnres_cases,
                                               run_attnres_case)
from k3compile.checking.verify_backward import gradient_rows, gradient_tolerance
from k3compile.checking.verify_common import not_power_of_two, tolerance, variant
from k3compile.checking.verify_moe import MoeCase, moe_cases, moe_tolerance, quick_moe_cases, run_moe_case
from k3compile.driver import CompiledLayer, lower, write_module
from k3compile.errors import ArgumentError, UnsupportedError
from k3compile.frontend import spec_to_module
from k3compile.ir import reference
from k3compile.spec import RECURRENCE_KINDS, LayerSpec

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class CaseResult:
    layer: str
    entry: str
    case: str
    dtype: str
    tensor: str
    max_abs: float
    rms_ratio: float
    tolerance: float

    @property
    def passed(self) -> bool:
        return math.isfinite(self.rms_ratio) and math.isfinite(self.max_abs) and self.rms_ratio <= self.tolerance


def compare(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    out = out.detach().to("cpu", torch.float64)
    ref = ref.detach().to("cpu", torch.float64)
    if out.shape != ref.shape:
        return math.inf, math.inf
    if not torch.isfinite(out).all():  # NaN: an element the kernel never wrote, or a blow-up
        return math.nan, math.nan
    diff = out - ref
    norm = ref.norm().item()
    return diff.abs().max().item() if diff.numel() else 0.0, diff.norm().item() / max(norm, 1e-30)


# --- the KDA family ------------------------------------------------------------------------


@dataclass(frozen=True)
class RecurrenceCase:
    name: str
    batch: int
    length: int
    seqlens: tuple[int, ...] | None = None  # varlen: lengths of the packed sequences
    initial_state: bool = True
    checkpoint_every: int | None = None  # chunk entry: also compare the states kept along the way
    segments: int | None = None  # chunk entry: context parallelism, every sequence split in this many
    # an unbounded channel gate decays about 10x faster from this (packed) token on, past what a
    # factored Gram diagonal block may span: the chunks there take the elementwise blocks
    steep_from: int | None = None
    # zero decays at these (packed) tokens, in every channel: log-decays of -1e9 and -inf in turn,
    # or a softplus gate's exp(A_log) softplus(1e9); a bounded form has none to give
    resets: tuple[int, ...] = ()
    dht: bool = True  # chunk_backward: a random cotangent of the final state (else none: zero)


def recurrence_inputs(layer_op, case: RecurrenceCase, dtype, device, gen) -> dict:
    H, HV = layer_op.num_heads.value.data, layer_op.num_v_heads.value.data
    K, V = layer_op.head_k_dim.value.data, layer_op.head_v_dim.value.data
    B, T = (1, sum(case.seqlens)) if case.seqlens else (case.batch, case.length)
    N = len(case.seqlens) if case.seqlens else B

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    normalised = not layer_op.input_option("qk_l2norm")  # else the kernel normalises raw q, k
    inputs = {
        "q": F.normalize(randn(B, T, H, K), dim=-1) if normalised else randn(B, T, H, K),
        "k": F.normalize(randn(B, T, H, K), dim=-1) if normalised else randn(B, T, H, K),
        "v": randn(B, T, HV, V),
    }
    gate = layer_op.gate.data
    if gate != "none":
        shape = (B, T, HV, K) if gate == "channel" else (B, T, HV)
        steep = slice(case.steep_from if case.steep_from is not None else T, None)
        if layer_op.input_option("gate_input") == "log":  # realistic log-decays: logsigmoid, clamped at -5
            inputs["g"] = F.logsigmoid(randn(*shape)).clamp(min=-5)
            inputs["g"][:, steep] *= 10
        elif layer_op.input_option("gate_input") == "clamped":  # the kernel clamps: some below the bound
            inputs["g"] = F.logsigmoid(3 * randn(*shape))
        else:  # raw gate projections and the gate's parameters (decays of exp(-0.5 .. -4) or so)
            inputs["g"] = randn(*shape)
            inputs["g"][:, steep] += 10  # softplus ~ 10: decays of exp(-6) a token or so
            inputs["A_log"] = -0.5 + 0.3 * randn(HV)
            inputs["dt_bias"] = 0.5 * randn(HV * K if gate == "channel" else HV)
        for i, t in enumerate(case.resets):
            if layer_op.input_option("gate_input") == "log":
                inputs["g"][:, t] = (-1e9, float("-inf"))[i % 2]
            elif layer_op.input_option("gate_input") == "softplus":
                inputs["g"][:, t] = 1e9
    if layer_op.delta_rule.value.data:
        beta = randn(B, T, HV)
        inputs["beta"] = beta if layer_op.input_option("beta_input") != "probability" else torch.sigmoid(beta)
    inputs = {k: v.to(device, dtype) for k, v in inputs.items()}
    if case.initial_state:
        shape = (N, HV, K, V) if layer_op.state_layout.data == "kv" else (N, HV, V, K)
        inputs["initial_state"] = (0.5 * randn(*shape)).to(device, torch.float32)
    if case.seqlens:
        offsets = [0]
        for length in case.seqlens:
            offsets.append(offsets[-1] + length)
        inputs["cu_seqlens"] = torch.tensor(offsets, dtype=torch.int64, device=device)
    return inputs


# --quick on a CPU: the interpreter runs every program of a grid in Python (about 0.5 s for one
# program of a chunk prepare), one per (chunk, value head), so the spec's layer there has this
# many query/key heads (value heads in the spec's ratio): the kernels' code is the same at any
# count, and two heads still catch a wrong head offset
QUICK_CPU_HEADS = 2


def quick_layer(spec: LayerSpec, on_gpu: bool) -> LayerSpec:
    """The layer --quick (and the full grid's chunk_backward) verifies: the spec itself, or on a
    CPU the spec with QUICK_CPU_HEADS heads."""
    H, HV = spec.params["num_heads"], spec.params["num_v_heads"]
    if on_gpu or H <= QUICK_CPU_HEADS:
        return spec
    return variant(spec, f"{QUICK_CPU_HEADS}heads", num_heads=QUICK_CPU_HEADS, num_v_heads=QUICK_CPU_HEADS * (HV // H))


def quick_recurrence_cases(spec: LayerSpec, on_gpu: bool) -> Iterator[tuple[LayerSpec, str, list[RecurrenceCase]]]:
    """One case per entry (`k3c verify --quick`): varlen with an empty, a one-token and
    odd-length sequences, initial states, the chunk entries over several chunks with a partial
    one. Each compares outputs and states against the reference, so a wrong kernel still fails."""
    layer = quick_layer(spec, on_gpu)
    yield layer, "recurrent", [RecurrenceCase("varlen (3, 0, 1, 3), initial states", 1, 0, seqlens=(3, 0, 1, 3))]
    yield layer, "decode", [RecurrenceCase("B3 T1 over a pool of 5 slots, one padding row", 3, 1)]
    yield layer, "chunk", [
        RecurrenceCase("varlen (17, 0, 1, 5), initial states, checkpoints every 16", 1, 0, seqlens=(17, 0, 1, 5),
                       checkpoint_every=16),
        RecurrenceCase("varlen (1, 22), initial states, 2 segments each, gates steep from token 12", 1, 0,
                       seqlens=(1, 22), segments=2, steep_from=12),
        RecurrenceCase("varlen (7, 18), zero decays at tokens 2, 9, 10", 1, 0, seqlens=(7, 18), resets=(2, 9, 10)),
    ]
    yield layer, "segment_summary", [RecurrenceCase("segments (5, 17, 1)", 1, 0, seqlens=(5, 17, 1),
                                                    initial_state=False)]
    yield layer, "chunk_backward", [RecurrenceCase("varlen (17, 0, 1, 5), initial states, dht", 1, 0,
                                                   seqlens=(17, 0, 1, 5))]


def recurrence_variants(spec: LayerSpec) -> list[tuple[LayerSpec, str]]:
    """The spec's variants every entry is verified on, each with the label its cases' names
    start with: grouped value heads (if the spec has none), negative eigenvalues (with the delta
    rule), head dims that are not powers of two."""
    p = spec.params
    variants = []
    if p["num_v_heads"] == p["num_heads"]:
        variants.append((variant(spec, "grouped", num_v_heads=2 * p["num_heads"]), "grouped value heads HV = 2H, "))
    if RECURRENCE_KINDS[spec.kind]["delta_rule"] and p["beta_input"] != "logits_neg_eigval":
        variants.append((variant(spec, "neg_eigval", beta_input="logits_neg_eigval"),
                         "beta = 2 sigmoid(logits) (negative eigenvalues), "))
    K, V = not_power_of_two(p["head_k_dim"]), not_power_of_two(p["head_v_dim"])
    variants.append((variant(spec, "npow2", head_k_dim=K, head_v_dim=V, scale=K**-0.5), f"K={K} V={V}, "))
    return variants


def bounded_gate_variant(spec: LayerSpec) -> tuple[LayerSpec, str] | None:
    """With an unbounded channel gate, the spec with the gate clamped at -5: the chunked Grams'
    diagonal blocks (and the backward's contractions) take their other, factored form."""
    if spec.kind not in ("kda", "gla") or spec.params.get("gate_input", "log") != "log":
        return None
    return variant(spec, "clamped", gate_input="clamped"), "gate clamped at -5 (factored Gram diagonal), "


def recurrence_cases(spec: LayerSpec, on_gpu: bool) -> Iterator[tuple[LayerSpec, str, list[RecurrenceCase]]]:
    """Per entry: the token loop (recurrent) and the chunked schedule (chunk, at the default
    pipeline's chunk size), then the gradients (gradient_cases). The interpreter runs each
    (program, token) step of `recurrent` in numpy, so its CPU cases are short; `chunk` cases
    always span several chunks with a partial one."""
    variants = recurrence_variants(spec)
    bounded = bounded_gate_variant(spec)
    for entry, long in (("recurrent", 257 if on_gpu else 19), ("chunk", 257 if on_gpu else 67)):
        yield spec, entry, [
            RecurrenceCase(f"B2 T{long} (odd T), initial state", 2, long),
            RecurrenceCase("B3 T9, zero start", 3, 9, initial_state=False),
            RecurrenceCase("B1 T1 (one token)", 1, 1),
            RecurrenceCase(f"varlen {(64, 0, 1, long)}", 1, 0, seqlens=(64, 0, 1, long)),
        ]
        if entry == "recurrent":  # serving: a slot table over a state pool, updated in place
            yield spec, "decode", [RecurrenceCase("B4 T1 over a pool of 6 slots, one padding row", 4, 1),
                                   RecurrenceCase("B3 T3 (verify-sized steps)", 3, 3)]
        if entry == "chunk":  # states kept every 64 tokens (prefix caching) equal the recurrence's
            yield spec, entry, [RecurrenceCase(f"varlen (64, 1, {long}), checkpoints every 64", 1, 0,
                                               seqlens=(64, 1, long), checkpoint_every=64),
                                # chunks past the factored diagonal's span (steep gates: a guarded
                                # Gram's elementwise blocks) beside chunks within it
                                RecurrenceCase(f"varlen (40, {long}), initial states, gates steep from token 57", 1,
                                               0, seqlens=(40, long), steep_from=57),
                                # the gate's domain reaches -inf: a zero decay resets the state
                                RecurrenceCase(f"varlen (40, {long}), zero decays at tokens 3, 20, 21, 70", 1, 0,
                                               seqlens=(40, long), resets=(3, 20, 21, 70)),
                                # context parallelism on one device (chunk_segments)
                                RecurrenceCase(f"varlen (5, {long}, 40), 3 segments each", 1, 0,
                                               seqlens=(5, long, 40), segments=3)]
        for layer_spec, label in variants + ([bounded] if entry == "chunk" and bounded else []):
            yield layer_spec, entry, [RecurrenceCase(f"{label}varlen (5, {long})", 1, 0, seqlens=(5, long))]
    # context parallelism: every segment's (M, N), segments shorter than, equal to and longer than
    # a chunk (on the CPU the interpreter is slow: the grouped-heads variant is left to the tests)
    yield spec, "segment_summary", [
        RecurrenceCase(f"segments {(5, 32, long, 1)}", 1, 0, seqlens=(5, 32, long, 1), initial_state=False),
        *([RecurrenceCase("B3 T9 (batch rows as segments)", 3, 9, initial_state=False)] if on_gpu else []),
    ]
    for layer_spec, label in variants if on_gpu else variants[-1:]:
        yield layer_spec, "segment_summary", [
            RecurrenceCase(f"{label}segments (5, {long})", 1, 0, seqlens=(5, long), initial_state=False)]
    yield from gradient_cases(spec, on_gpu)


def gradient_cases(spec: LayerSpec, on_gpu: bool) -> Iterator[tuple[LayerSpec, str, list[RecurrenceCase]]]:
    """chunk_backward, every gradient: odd lengths over several chunks with a partial one; an
    initial state and a cotangent of the final state (dht; dh0 compared too) in every case but
    the zero start; varlen with an empty and a one-token sequence; steep gates (a channel Gram's
    cotangents contracted elementwise); the variants. On a GPU every variant at the spec's size.
    On a CPU the gradients kernel runs one program per (chunk, value head) in the interpreter, so
    the layers have QUICK_CPU_HEADS heads (as --quick's) and grouped value heads are the one
    variant (none if the spec has them)."""
    long = 257 if on_gpu else 37
    cases = [
        RecurrenceCase(f"B2 T{long} (odd T), initial state, dht", 2, long),
        RecurrenceCase("B3 T21, zero start, no dht", 3, 21, initial_state=False, dht=False),
        RecurrenceCase(f"varlen (16, 0, 1, {long}), initial states, dht", 1, 0, seqlens=(16, 0, 1, long)),
    ]
    if RECURRENCE_KINDS[spec.kind]["gate"] != "none":
        cases += [RecurrenceCase(f"varlen (20, {long}), gates steep from token 30", 1, 0,
                                 seqlens=(20, long), steep_from=30),
                  RecurrenceCase(f"varlen (20, {long}), zero decays at tokens 3, 20, 21, 40", 1, 0,
                                 seqlens=(20, long), resets=(3, 20, 21, 40))]
    yield quick_layer(spec, on_gpu), "chunk_backward", cases
    bounded = bounded_gate_variant(spec)
    for layer_spec, label in recurrence_variants(spec) + ([bounded] if bounded else []):
        grouped = layer_spec.params["num_v_heads"] != spec.params["num_v_heads"]
        if on_gpu or grouped:
            yield quick_layer(layer_spec, on_gpu), "chunk_backward", [
                RecurrenceCase(f"{label}varlen (5, {long})", 1, 0, seqlens=(5, long))]


def run_decode_case(layer: CompiledLayer, layer_op, case, dtype, device, gen):
    """decode over a state pool: the rows named by state_indices advance in place (padding -1
    starts from zero), every other row stays bit-identical."""
    inputs = recurrence_inputs(layer_op, case, dtype, device, gen)
    pool_rows = case.batch + 2
    pool = inputs.pop("initial_state")[:1].repeat(pool_rows, 1, 1, 1)
    pool = pool + 0.5 * torch.randn(pool.shape, generator=gen, dtype=torch.float64).to(pool.device, pool.dtype)
    slots = torch.randperm(pool_rows, generator=gen)[: case.batch]
    if case.batch > 1:
        slots[1] = -1  # a padding row of a continuous batch
    before = pool.clone()
    starts = torch.stack([before[i] if i >= 0 else torch.zeros_like(before[0]) for i in slots.tolist()])
    (o,) = layer.decode(**inputs, state=pool, state_indices=slots.to(device))
    ref_o, ref_final = reference.recurrence(layer_op, **inputs, initial_state=starts, output_final_state=True)
    used = [i for i in slots.tolist() if i >= 0]
    untouched = [i for i in range(pool_rows) if i not in used]
    changed = (pool[untouched] != before[untouched]).sum().item()
    rows = [b for b, i in enumerate(slots.tolist()) if i >= 0]
    return [
        ("o", o, ref_o),
        ("state (slots)", pool[used], ref_final[rows]),
        # other rows: compared with themselves, so any write shows as an error
        ("state (others)", pool[untouched], before[untouched].double() + (math.nan if changed else 0.0)),
    ]


def run_summary_case(layer: CompiledLayer, layer_op, inputs: dict):
    """segment_summary: (M, N) of every segment (each sequence of cu_seqlens, or batch row)
    against the float64 definition."""
    B, T = inputs["k"].shape[:2]
    kept = {n: x for n, x in inputs.items() if n in ("k", "v", "g", "beta", "cu_seqlens", "A_log", "dt_bias")}
    segments = inputs.get("cu_seqlens", torch.arange(0, B * T + 1, T))
    out = layer.segment_summary(**kept)
    ref_M, ref_N = reference.segment_summaries(layer_op, segments=segments.cpu(), **{
        n: x.cpu() if isinstance(x, torch.Tensor) else x for n, x in kept.items()})
    if ref_M is None:
        return [("N", out[0], ref_N)]
    return [("M", out[0], ref_M), ("N", out[1], ref_N)]


def run_recurrence_case(layer: CompiledLayer, entry: str, layer_op, case, dtype, device, gen):
    if entry == "decode":
        return run_decode_case(layer, layer_op, case, dtype, device, gen)
    inputs = recurrence_inputs(layer_op, case, dtype, device, gen)
    if entry == "segment_summary":
        return run_summary_case(layer, layer_op, inputs)
    if entry == "chunk_backward":
        return gradient_rows(layer.module, layer_op, inputs, case.dht, gen)
    if case.checkpoint_every:
        inputs["checkpoint_every"] = case.checkpoint_every
        o, final, kept = getattr(layer, entry)(**inputs, output_final_state=True)
        ref_o, ref_final, ref_kept = reference.recurrence(layer_op, **inputs, output_final_state=True)
        return [("o", o, ref_o), ("final_state", final, ref_final), ("checkpoints", kept, ref_kept)]
    split = {} if case.segments is None else {"segments": case.segments}
    o, final = getattr(layer, entry)(**inputs, **split, output_final_state=True)
    ref_o, ref_final = reference.recurrence(layer_op, **inputs, output_final_state=True)
    return [("o", o, ref_o), ("final_state", final, ref_final)]


@dataclass(frozen=True)
class Family:
    full: Callable  # (spec, on_gpu) -> (layer spec, entry, cases) of the full grid
    quick: Callable  # the same, one case per entry (--quick)
    run: Callable  # (layer, entry, layer op, case, dtype, device, generator) -> [(tensor, out, ref)]
    tolerance: Callable = lambda entry, tensor, dtype: tolerance(entry, dtype)  # the RMS ratio allowed


def recurrence_tolerance(entry: str, tensor: str, dtype) -> float:
    """The RMS ratio a recurrence entry's tensor may differ by: each gradient its own."""
    return gradient_tolerance(tensor, dtype) if entry == "chunk_backward" else tolerance(entry, dtype)


FAMILIES: dict[str, Family] = {kind: Family(recurrence_cases, quick_recurrence_cases, run_recurrence_case,
                                            recurrence_tolerance)
                               for kind in RECURRENCE_KINDS}
FAMILIES["attnres"] = Family(attnres_cases, quick_attnres_cases, run_attnres_case, attnres_tolerance)
FAMILIES["latent_moe"] = Family(moe_cases, quick_moe_cases, run_moe_case, moe_tolerance)


def check_device(device: str) -> str:
    """The device as torch names it, or ArgumentError: only cpu (the interpreter) and a CUDA GPU
    that this machine has run the kernels."""
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        raise ArgumentError(f"device {device!r}: expected cpu or cuda (cuda:N for the N-th GPU)") from None
    if parsed.type not in ("cpu", "cuda"):
        raise ArgumentError(f"device {device!r}: the kernels run on cpu (Triton's interpreter) or cuda, not {parsed.type}")
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise ArgumentError(f"device {device!r}: no CUDA GPU here (torch.cuda.is_available() is False); "
                                "use cpu for Triton's interpreter")
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise ArgumentError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA GPU(s)")
    return str(parsed)


def defaults(device: str | None, dtypes: list[str] | None) -> tuple[str, list[str]]:
    """The device (cuda if available; ArgumentError if this machine lacks the one asked for) and
    dtypes (CPU: fp32 in the interpreter; GPU: bf16, fp16 and fp32) of a run."""
    device = check_device(device) if device is not None else "cuda" if torch.cuda.is_available() else "cpu"
    dtypes = dtypes or (["bfloat16", "float16", "float32"] if device != "cpu" else ["float32"])
    return device, list(dict.fromkeys(dtypes))  # each once: a repeated dtype would run every case twice


def grid(spec: LayerSpec, on_gpu: bool, dtypes: list[str], quick: bool = False
         ) -> list[tuple[LayerSpec, str, RecurrenceCase | AttnResCase | MoeCase, str]]:
    """Every (layer, entry, case, dtype) of a run, in a fixed order: the positions --shard splits.
    quick: one case per entry (quick_recurrence_cases). Cheap: it builds the variants' specs,
    nothing is lowered."""
    family = FAMILIES[spec.kind]
    make_cases = family.quick if quick else family.full
    return [(layer_spec, entry, case, dtype_name) for layer_spec, entry, cases in make_cases(spec, on_gpu)
            for case in cases for dtype_name in dtypes]


def run_cases(spec: LayerSpec, cases: list, device: str, gen: torch.Generator, out_dir: Path,
              progress: Callable[[int, int, str], None] | None) -> list[CaseResult]:
    """Run `cases` (rows of `grid`), each layer's module written to out_dir when a case first needs it."""
    family = FAMILIES[spec.kind]
    results = []
    layers: dict[str, tuple] = {}
    # a shard lowers a layer only when one of its own cases needs it and launches (so Triton
    # compiles) only its own cases' kernels: the others' compile time is what sharding saves
    for done, (layer_spec, entry, case, dtype_name) in enumerate(cases):
        if progress:
            progress(done, len(cases), f"{layer_spec.name}.{entry}: {case.name} [{dtype_name}]")
        if layer_spec.name not in layers:
            compilation = lower(layer_spec)
            layer = CompiledLayer(compilation, write_module(compilation, out_dir))
            layer.module.POISON_OUTPUTS = True
            layers[layer_spec.name] = (layer, next(iter(spec_to_module(layer_spec).ops)))
        layer, layer_op = layers[layer_spec.name]
        dtype = DTYPES[dtype_name]
        try:
            # Triton's interpreter runs the kernels in numpy, values they discard included: a
            # guarded Gram's factored operands, computed before its span check picks the
            # elementwise blocks for steep gates, overflow there (exp2), and masked lanes' zeros
            # times that inf are NaN. What the kernels keep is compared below: a NaN or inf fails.
            with numpy.errstate(over="ignore", invalid="ignore"):
                rows = family.run(layer, entry, layer_op, case, dtype, device, gen)
            for tensor, out, ref in rows:
                max_abs, rms = compare(out, ref)
                results.append(CaseResult(layer_spec.name, entry, case.name, dtype_name, tensor, max_abs, rms,
                                          family.tolerance(entry, tensor, dtype)))
        except Exception as error:  # an access outside the launch's tensors fails its case (checked before it happens)
            # Triton's interpreter, loaded only once a case has failed (a GPU run never needs it)
            from k3compile.checking.interpreter_bounds import raised_by

            if (outside := raised_by(error)) is None:
                raise
            results.append(CaseResult(layer_spec.name, entry, case.name, dtype_name, f"out of bounds: {outside}",
                                      math.inf, math.inf, 0.0))
    return results


def verify(spec: LayerSpec, device: str | None = None, dtypes: list[str] | None = None,
           seed: int | None = None, out_dir: Path | None = None,
           progress: Callable[[int, int, str], None] | None = None,
           shard: tuple[int, int] | None = None, quick: bool = False) -> list[CaseResult]:
    """Run the verification grid of a spec. On a CPU: Triton's interpreter in fp32; on a GPU:
    native, in bf16, fp16 and fp32 (unless `dtypes` says otherwise). shard=(I, N): only the cases at
    positions p of `grid` with p % N == I; quick: one case per entry (see `grid`).
    progress(done, total, case) is called before each case and once at the end (case "").
    The modules go to out_dir, by default a temporary folder removed when the run ends (however it ends).
    Raises UnsupportedError for a kind without verification cases, ArgumentError for a device this machine
    lacks or a seed torch cannot take."""
    if spec.kind not in FAMILIES:
        raise UnsupportedError(f"{spec.source}: kind '{spec.kind}' has no verification cases yet")
    device, dtypes = defaults(device, dtypes)
    if seed is not None and not -2**63 <= seed < 2**64:  # what torch.Generator takes
        raise ArgumentError(f"seed: expected an integer in -2**63 .. 2**64 - 1, got {seed}")
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # read by Triton when a kernel is first launched
        from k3compile.checking import interpreter_bf16, interpreter_bounds  # import Triton: after the line above

        interpreter_bounds.install()  # every launch checks that its loads and stores stay inside its tensors
        interpreter_bf16.install()  # and computes on bf16 operands' values, not their bits
    on_gpu = device != "cpu"
    gen = torch.Generator().manual_seed(seed if seed is not None else int.from_bytes(os.urandom(4), "little"))
    index, count = shard or (0, 1)
    cases = grid(spec, on_gpu, dtypes, quick)[index::count]
    with contextlib.ExitStack() as stack:
        if out_dir is None:
            out_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="k3c-verify-")))
        results = run_cases(spec, cases, device, gen, out_dir, progress)
    if progress:
        progress(len(cases), len(cases), "")
    return results
