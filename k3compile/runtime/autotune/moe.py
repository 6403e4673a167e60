"""Tuning the LatentMoE layer's dispatch table (`k3c tune` of a latent_moe spec): per token
bucket, the plan and the warp plan's launch tiles that run `moe` fastest there.

A bucket is a token count T (MOE_TOKENS by default: the counts the H100 measured). Its
candidates are the plans and tiles of moe_candidates, each a module whose table sends every call
of up to T rows to it (lower-moe-experts{dispatch="T=plan"}); a candidate is checked against the
float64 reference at T rows of the layer (outputs NaN-poisoned: an element never written fails)
before it is timed there, so a wrong one never wins. The record (the cache's, under the entry
"moe", bucket T) keeps every candidate's time; moe_table() makes the module's table of the
buckets' winners, which `k3c compile` and k3compile.ops embed (compile.embed_records).
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from k3compile.runtime.autotune.cache import TuneCache, cache_key, k3compile_version, schedule_hash, triton_version
from k3compile.runtime.autotune.measure import gpu_name, short, time_candidate
from k3compile.runtime.autotune.search import TuningError
from k3compile.runtime.autotune.space import MOE_ENTRY, Bucket, Candidate, base_pipeline, join_pipeline, split_pipeline

MOE_PASS = "lower-moe-experts"
MOE_TOKENS = (1, 4, 16, 64)  # bench/results/moe_decode_plans_h100_f3f7295.md's token counts
# the warp plan's (BN, BD) candidates: the pass's default first, then narrower and wider steps
# (bench/results/moe_tiles_h200.md found 4 x 512 to 32 x 128 best for the split plan's down
# projection at 1-32 tokens); every BD a multiple of 32, MXFP4's scale blocks
WARP_TILES = ((4, 128), (8, 64), (8, 128), (16, 128), (2, 256))


def moe_candidates(tokens: int, warp_tiles: Sequence[tuple[int, int]] = WARP_TILES) -> list[str]:
    """The buckets (moe_dispatch's spelling) tried at `tokens`: split, every warp tile, prefill."""
    return [f"{tokens}=split", *(f"{tokens}=warp/{bn}x{bd}" for bn, bd in warp_tiles), f"{tokens}=prefill"]


def moe_key(spec, pipeline: str | None, tokens: int, dtype: str, gpu: str) -> dict:
    """The cache key of the `moe` table's bucket of `tokens` rows (no heads: bucket heads 0)."""
    return cache_key(schedule_hash(spec, base_pipeline(spec, pipeline)), Bucket(0, tokens), dtype, gpu,
                     triton_version(), k3compile_version(), MOE_ENTRY)


def with_dispatch(spec, pipeline: str | None, table: str) -> str:
    """The pipeline with lower-moe-experts' dispatch option set to `table`."""
    passes = split_pipeline(base_pipeline(spec, pipeline))
    names = [name for name, _ in passes]
    if MOE_PASS not in names:
        raise TuningError(f"{spec.name} ({spec.source}): the pipeline has no {MOE_PASS}, whose dispatch table is tuned")
    passes[names.index(MOE_PASS)][1]["dispatch"] = f'"{table}"'
    return join_pipeline(passes)


def moe_inputs(layer_op, module, tokens: int, dtype, device: str, seed: int = 0) -> dict:
    """The layer's arguments at `tokens` rows: the routing's as k3compile.checking.verify_moe draws them
    (no near ties), the weights drawn in `dtype` on the device (at K3's widths the experts' are
    ~60 GB in bf16: no fp32 copy), MXFP4 weights packed by the module."""
    # torch: importing k3compile.runtime.autotune (k3compile.ops does) loads none
    import torch

    # xDSL, torch: importing k3compile.runtime.autotune (k3compile.ops does) loads neither
    from k3compile.checking.verify_moe import MoeCase, routing_inputs

    gen = torch.Generator().manual_seed(seed)
    arguments = routing_inputs(layer_op, MoeCase(f"R{tokens}", tokens), dtype, device, gen, every_rank=False)
    value = lambda name: getattr(layer_op, name).value.data  # noqa: E731
    d, l, F, S, Fs = (value(name) for name in ("hidden_size", "latent_dim", "expert_ffn_dim", "num_shared_experts",
                                                "shared_ffn_dim"))
    E, w = value("num_experts"), l or d
    device_gen = torch.Generator(device).manual_seed(seed + 1)

    def randn(*shape, scale: float):
        return torch.randn(*shape, generator=device_gen, device=device, dtype=dtype).mul_(scale)

    # 1 / sqrt(fan-in): activations stay O(1) through every projection (verify_moe's weights)
    arguments |= {"expert_gate_up": randn(E, 2 * F, w, scale=w ** -0.5), "expert_down": randn(E, w, F, scale=F ** -0.5)}
    if l:
        arguments |= {"latent_down": randn(l, d, scale=d ** -0.5), "latent_up": randn(d, l, scale=l ** -0.5),
                      "latent_norm_gain": randn(l, scale=0.2).add_(1.0)}
    if S and Fs:
        arguments |= {"shared_gate_up": randn(S, 2 * Fs, d, scale=d ** -0.5),
                      "shared_down": randn(S, d, Fs, scale=Fs ** -0.5)}

    if layer_op.weight_format == "mxfp4":
        arguments |= module.pack_expert_weights(arguments.pop("expert_gate_up"), arguments.pop("expert_down"))
    return arguments


def tune_moe(spec, tokens: int, dtype: str = "bfloat16", *, pipeline: str | None = None,
             cache: TuneCache | None = None, timer: Callable | None = None, device: str = "cuda",
             retune: bool = False, warp_tiles: Sequence[tuple[int, int]] = WARP_TILES) -> dict:
    """The record of `spec`'s bucket of `tokens` rows in `dtype` on this GPU: from the cache, or
    tuned now (every candidate compiled, checked, timed; the fastest passing one its winner)."""
    # xDSL, torch: importing k3compile.runtime.autotune (k3compile.ops does) loads neither
    from k3compile.runtime.autotune.search import parse_dtype
    from k3compile.frontend import spec_to_module

    if spec.kind != "latent_moe":
        raise TuningError(f"{spec.name} ({spec.source}): the dispatch table is a latent_moe layer's, not {spec.kind}'s")
    if tokens < 1:
        raise TuningError(f"--tokens: expected a positive token count, got {tokens}")
    gpu = gpu_name()
    if gpu is None:
        raise TuningError("no CUDA GPU here: the dispatch table is tuned per GPU")
    cache = cache or TuneCache()
    key = moe_key(spec, pipeline, tokens, dtype, gpu)
    if not retune and (record := cache.get(key)) is not None:
        return record
    layer_op = next(iter(spec_to_module(spec).ops))
    started = time.perf_counter()
    candidates = [Candidate(index, {"dispatch": bucket}, with_dispatch(spec, pipeline, bucket), {})
                  for index, bucket in enumerate(moe_candidates(tokens, warp_tiles))]
    with tempfile.TemporaryDirectory(prefix="k3c-tune-moe-") as folder:
        for candidate in candidates:
            try:
                candidate.ms = check_and_time(spec, layer_op, candidate, tokens, parse_dtype(dtype), device,
                                              Path(folder), timer or time_candidate)
                candidate.status = "ok"
            except Exception as err:  # noqa: BLE001 - a candidate that fails to compile, run or match scores infinity
                candidate.ms, candidate.status, candidate.detail = math.inf, "failed", short(err)
    passing = [c for c in candidates if c.status == "ok"]
    record = {
        "key": key,
        "spec": {"name": spec.name, "source": str(spec.source), "kind": spec.kind},
        "space": [{"pass": MOE_PASS, "option": "dispatch", "values": [c.options["dispatch"] for c in candidates],
                   "launch_only": False}],
        "candidates": [c.to_json() for c in candidates],
        "winner": min(passing, key=lambda c: c.ms).index if passing else None,
        "phases": {"tune": time.perf_counter() - started},
    }
    cache.put(record)
    return record


def check_and_time(spec, layer_op, candidate: Candidate, tokens: int, dtype, device: str, folder: Path,
                   timer: Callable) -> float:
    """Milliseconds of the candidate's `moe` at `tokens` rows, after its NaN-poisoned output
    matched the float64 reference there (else an AssertionError saying by how much)."""
    # xDSL, torch: importing k3compile.runtime.autotune (k3compile.ops does) loads neither
    from k3compile.driver import load_module, lower
    from k3compile.ir import reference
    from k3compile.checking.verify import compare
    from k3compile.checking.verify_moe import MOE_RMS_TOLERANCE

    path = folder / f"{spec.name}_moe{candidate.index}.py"
    path.write_text(lower(spec, candidate.pipeline).source)
    module = load_module(path, f"{spec.name}_moe_tune{candidate.index}")
    arguments = moe_inputs(layer_op, module, tokens, dtype, device)
    module.POISON_OUTPUTS = True  # an element the plan never writes stays NaN and fails
    try:
        (out,) = module.moe(**arguments)
    finally:
        module.POISON_OUTPUTS = False
    _, ratio = compare(out, reference.latent_moe(layer_op, **arguments))
    if not ratio <= MOE_RMS_TOLERANCE[dtype]:
        raise AssertionError(f"RMS ratio to float64 {ratio:.2e} above {MOE_RMS_TOLERANCE[dtype]:.0e}")
    return timer(lambda: module.moe(**arguments), candidate)


def moe_table(records: list[dict]) -> str | None:
    """The dispatch table of the buckets' winners (moe_dispatch's spelling), in increasing token
    counts; None without a winner. Of several dtypes' records, bfloat16's (the serving dtype),
    else the first dtype's: one module has one table."""
    dtypes = sorted({record["key"]["dtype"] for record in records if record.get("winner") is not None},
                    key=lambda dtype: dtype != "bfloat16")
    if not dtypes:
        return None
    chosen = sorted((r for r in records if r["key"]["dtype"] == dtypes[0] and r.get("winner") is not None),
                    key=lambda r: r["key"]["tokens_bucket"])
    return ",".join(r["candidates"][r["winner"]]["options"]["dispatch"] for r in chosen)
