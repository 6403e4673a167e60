"""The search: tune() takes every candidate of an entry (chunk or chunk_backward) and bucket
(space.py), compiles it into one module per kernel code, checks and times it (measure.py), picks
the fastest that passed, runs the context-parallel stage on the forward's winner, and caches the
record (cache.py); a cached record is returned without compiling or timing anything. TuneResult
is what it returns.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from k3compile.runtime.autotune.cache import TuneCache, entry_of, key_for
from k3compile.runtime.autotune.measure import (
                                                DEFAULT_CHECK_SHAPE,
                                                check_and_time,
                                                check_shape_for,
                                                gpu_name,
                                                precompile,
                                                short,
                                                time_candidate,
                                                timing_inputs,
                                                with_cotangents,
                                                )
from k3compile.runtime.autotune.space import (
                                              BACKWARD_ENTRY,
                                              BACKWARD_SEARCH_SPACE,
                                              ENTRIES,
                                              SEARCH_SPACE,
                                              SEGMENTS,
                                              TUNED_ENTRY,
                                              Candidate,
                                              Choice,
                                              base_pipeline,
                                              candidates,
                                              has_entry,
                                              kernel_code_hash,
                                              launch_configs,
                                              module_code_hash,
                                              with_pass_defaults,
                                              )
from k3compile.errors import K3Error
from k3compile.ir.choices import DTYPES


class TuningError(K3Error):
    """Tuning cannot run, or (frozen) a needed tuned config is not in the cache."""


@dataclass
class TuneResult:
    record: dict
    cached: bool  # found in the cache: nothing compiled or timed
    seconds: float  # wall time of this call
    timed: int  # calls of the timer
    path: Path | None = None
    messages: list[str] = field(default_factory=list)

    @property
    def entry(self) -> str:
        return entry_of(self.record["key"])

    @property
    def candidates(self) -> list[Candidate]:
        return [Candidate.from_json(c) for c in self.record["candidates"]]

    @property
    def winner(self) -> Candidate | None:
        index = self.record.get("winner")
        return None if index is None else self.candidates[index]

    @property
    def default(self) -> Candidate | None:
        index = self.record.get("default")
        return None if index is None else self.candidates[index]


def parse_dtype(name: str):
    # torch: importing k3compile.runtime.autotune (k3compile.ops does) loads none
    import torch

    if name not in DTYPES:
        raise TuningError(f"dtype must be one of {', '.join(DTYPES)}, got {name!r}")
    return getattr(torch, name)


def tune(spec, shape: tuple[int, int], dtype: str = "bfloat16", *, pipeline: str | None = None,
         gpu: str | None = None, timer: Callable | None = None, cache: TuneCache | None = None,
         space: Sequence[Choice] | None = None, check_shape: tuple[int, int] | None = None,
         retune: bool = False, jobs: int | None = None, segments: Sequence[int] | None = None,
         progress: Callable[[int, int, str], None] | None = None, entry: str = TUNED_ENTRY) -> TuneResult:
    """Tune `entry` of `spec` (chunk: the forward, then its context-parallel stage, P of
    `segments`, default SEGMENTS; chunk_backward: the backward, each candidate's gradients checked
    against float64 autograd of the reference) for the bucket of shape (B, T) and dtype; cached
    results are returned without compiling or timing anything (unless retune)."""
    # xDSL, torch: importing k3compile.runtime.autotune (k3compile.ops does) loads neither
    from k3compile.driver import load_module, lower
    from k3compile.frontend import spec_to_module

    start = time.perf_counter()
    if entry not in ENTRIES:
        raise TuningError(f"the tuned entries are {', '.join(ENTRIES)}, got {entry!r}")
    backward = entry == BACKWARD_ENTRY
    space = with_pass_defaults(BACKWARD_SEARCH_SPACE if backward else SEARCH_SPACE) if space is None else space
    check_shape = check_shape or DEFAULT_CHECK_SHAPE or check_shape_for(shape[1])
    torch_dtype = parse_dtype(dtype)
    pipeline = base_pipeline(spec, pipeline)
    if not spec.is_recurrence:
        raise TuningError(f"{spec.source}: kind '{spec.kind}' has no {entry} entry to tune")
    found = candidates(pipeline, space, entry)
    if not found:
        raise TuningError(f"{spec.source}: pipeline '{pipeline}' has none of the tuned passes of {entry} "
                          f"({', '.join(sorted({c.pass_name for c in space}))})")
    gpu = gpu if gpu is not None else gpu_name()
    if gpu is None:
        raise TuningError("no CUDA GPU here: tuning times the kernels on the GPU they will run on")
    batch, tokens = shape
    if batch < 1 or tokens < 1:
        raise TuningError(f"shape B,T must be positive, got {batch},{tokens}")
    layer_op = next(iter(spec_to_module(spec).ops))
    cache = cache or TuneCache()
    key = key_for(spec, pipeline, shape, dtype, gpu, entry)
    if not retune:
        record = cache.get(key)
        if record is not None:
            return TuneResult(record, True, time.perf_counter() - start, 0, cache.path(key))

    # torch: importing k3compile.runtime.autotune (k3compile.ops does) loads none
    import torch

    # xDSL, torch: importing k3compile.runtime.autotune (k3compile.ops does) loads neither
    from k3compile.ir import reference
    from k3compile.checking.verify import RecurrenceCase, recurrence_inputs, tolerance

    timer = timer or time_candidate
    timed = [0]

    def timed_call(fn, cand):
        timed[0] += 1
        return timer(fn, cand)
    device = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
    phases = {"compile": 0.0, "precompile": 0.0, "check": 0.0, "time": 0.0}
    total = len(found)
    best: list[Candidate] = []

    def report(done: int) -> None:
        if progress:
            lead = min(best, key=lambda c: c.ms) if best else None
            progress(done, total, f"best {lead.ms:.3f} ms ({lead.label})" if lead else "no passing candidate yet")

    report(0)
    # 1. the pipeline of every candidate: its kernel code and launch configs
    t0 = time.perf_counter()
    sources: dict[int, str] = {}
    modules_of: dict[int, str] = {}  # candidate -> module_code_hash of its module
    for cand in found:
        try:
            compilation = lower(spec, cand.pipeline, launch_tables={entry: {}})
            if not has_entry(compilation, entry):
                raise TuningError(f"pipeline '{cand.pipeline}' has no '{entry}' entry")
            cand.code_hash = kernel_code_hash(compilation.source)
            cand.launch = launch_configs(compilation, entry)
            sources[cand.index] = compilation.source
            modules_of[cand.index] = module_code_hash(compilation.source)
        except Exception as err:  # noqa: BLE001 - a candidate that does not compile scores infinity
            cand.status, cand.detail = "compile error", short(err)
    groups: dict[tuple, list[Candidate]] = {}
    programs: dict[tuple, Candidate] = {}  # (module hash, launch) -> the first candidate of that program
    for cand in found:
        if cand.status == "pending":
            group = groups.setdefault((tuple(sorted(cand.code_options.items())), cand.code_hash), [])
            same = next((c for c in group if c.launch == cand.launch), None)
            if same is not None:  # e.g. block-v 128 when V = 64: the launch of block-v 64
                cand.status, cand.detail = f"same as #{same.index}", "same kernel code and launch config"
                continue
            program = programs.setdefault((modules_of[cand.index], json.dumps(cand.launch, sort_keys=True)), cand)
            if program is not cand:  # other code options, the same module (GLA's scan-values)
                cand.status, cand.detail = f"same as #{program.index}", "same generated module and launch config"
            else:
                group.append(cand)
    groups = {code: group for code, group in groups.items() if group}
    phases["compile"] = time.perf_counter() - t0

    # 2. one module per kernel code; the reference once
    check_case = RecurrenceCase("tune check", check_shape[0], check_shape[1])
    gen = torch.Generator().manual_seed(1234)
    check = recurrence_inputs(layer_op, check_case, torch_dtype, device, gen)
    target = timing_inputs(layer_op, batch, tokens, torch_dtype, device)
    t0 = time.perf_counter()
    if backward:  # the gradients of <do, o> + <dht, final_state> by float64 autograd, dh0 included
        # xDSL, torch: importing k3compile.runtime.autotune (k3compile.ops does) loads neither
        from k3compile.checking.verify_backward import draw_cotangents, gradient_tolerance, reference_gradients

        do, dht = draw_cotangents(layer_op, check, True, gen)
        check = {**check, "do": do, "dht": dht}
        grads = reference_gradients(layer_op, {n: x for n, x in check.items() if n not in ("do", "dht")}, do, dht)
        ref = {f"d{n}": grad for n, grad in grads.items() if grad is not None}
        tol = {name: gradient_tolerance(name, torch_dtype) for name in ref}
        target = with_cotangents(layer_op, target)
    else:
        ref_o, ref_state = reference.recurrence(layer_op, **check, output_final_state=True)
        ref = {"o": ref_o, "final_state": ref_state}
        tol = tolerance(TUNED_ENTRY, torch_dtype)
    phases["check"] += time.perf_counter() - t0
    done = sum(c.status != "pending" for c in found)
    with tempfile.TemporaryDirectory(prefix="k3c-tune-") as tmp:
        t0 = time.perf_counter()
        modules = []
        for number, group in enumerate(groups.values()):
            path = Path(tmp) / f"{spec.name}_tune{number}.py"
            path.write_text(sources[group[0].index])
            modules.append((load_module(path, f"{spec.name}_tune{number}"), group))
        phases["compile"] += time.perf_counter() - t0
        if device == "cuda":
            t0 = time.perf_counter()
            try:
                precompile(modules, entry, [check, target], jobs or min(32, os.cpu_count() or 1))
            except Exception:  # noqa: BLE001, S110 - only a speed-up: the runs below compile what is missing
                pass
            phases["precompile"] += time.perf_counter() - t0
        # (status, ms, detail) of one call of a candidate (measure.py)
        measure = partial(check_and_time, check=check, reference=ref, target=target, tol=tol,
                          timer=timed_call, phases=phases, entry_name=entry)

        for module, group in modules:
            for cand in group:
                cand.status, cand.ms, cand.detail = measure(module, cand)
                if cand.status == "ok":
                    best.append(cand)
                done += 1
                report(done)
            sys.modules.pop(module.__name__, None)
        ok = [c for c in found if c.status == "ok"]
        winner = min(ok, key=lambda c: c.ms) if ok else None
        segments_record = None
        module = next((m for m, group in modules if winner in group), None)
        if winner is not None and not backward and hasattr(module, "_CHUNK_CP"):
            rows = [{"P": 1, "status": "ok", "ms": winner.ms, "detail": "the winner"}]
            for P in SEGMENTS if segments is None else segments:
                status, ms, detail = measure(module, winner, segments=P)
                rows.append({"P": P, "status": status, "ms": ms if math.isfinite(ms) else None, "detail": detail})
            fastest = min((r for r in rows if r["status"] == "ok"), key=lambda r: r["ms"])
            segments_record = {"candidates": rows, "winner": fastest["P"]}
    if device == "cuda":
        torch.cuda.synchronize()
    report(total)
    record = {
        "key": key,
        "spec": {"name": spec.name, "source": str(spec.source), "kind": spec.kind},
        "pipeline": pipeline,
        "shape": [batch, tokens],
        "space": [{"pass": c.pass_name, "option": c.option, "values": list(c.values), "launch_only": c.launch_only}
                  for c in space],
        "candidates": [c.to_json() for c in found],
        "winner": None if winner is None else winner.index,
        "segments": segments_record,  # the forward's context-parallel stage (SEGMENTS), None without one
        "default": 0,  # the first value of every choice: the heuristic default
        "seconds": round(time.perf_counter() - start, 3),
        "phases": {k: round(v, 3) for k, v in phases.items()},
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    result = TuneResult(record, False, time.perf_counter() - start, timed[0])
    try:
        result.path = cache.put(record)
    except OSError as err:
        result.messages.append(f"could not write the tuning cache {cache.root} ({err.strerror}); the result is not kept")
    return result

