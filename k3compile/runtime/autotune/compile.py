"""Compiling with tuned configs: compile_tuned() turns the cached records of a spec's buckets
into a module (embed_records): per tuned entry (chunk, and chunk_backward where `k3c tune
--entry` cached it), one kernel code for the whole module (the code closest to each bucket's
winner, choose_code) and a launch table per bucket (block sizes, num_warps, num_stages, the
forward's P of segments="auto") that the entry's generated launches read (TUNED_CHUNK,
TUNED_CHUNK_BACKWARD). k3compile.ops embeds its layers' records the same way (cached_records,
embed_records); a record tuned under another name of the layer has its kernels renamed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from k3compile.runtime.autotune.cache import (
                                              TuneCache,
                                              k3compile_version,
                                              key_for,
                                              schedule_hash,
                                              triton_version,
                                              )
from k3compile.runtime.autotune.measure import gpu_name
from k3compile.runtime.autotune.search import TuningError
from k3compile.runtime.autotune.moe import moe_table, with_dispatch
from k3compile.runtime.autotune.space import (
                                              BACKWARD_ENTRY,
                                              CACHED_ENTRIES,
                                              COPIED_ENTRIES,
                                              MOE_ENTRY,
                                              TUNED_ENTRY,
                                              Bucket,
                                              Candidate,
                                              base_pipeline,
                                              copied_table,
                                              entry_pipeline,
                                              join_pipeline,
                                              kernel_code_hash,
                                              split_pipeline,
                                              tunable,
                                              )


@dataclass
class ModulePlan:
    """What a compile embeds: the pipeline (code choices), the launch tables and a docstring
    note, plus one-line messages for the user."""

    pipeline: str | None
    launch_tables: dict = field(default_factory=dict)
    note: str = ""
    messages: list[str] = field(default_factory=list)
    records: list[dict] = field(default_factory=list)


def choose_code(records: list[dict]) -> tuple[dict, str] | None:
    """The kernel code (code options, code hash) for a module serving several buckets: the one
    whose best candidate is closest to each bucket's winner (least geometric-mean slowdown);
    ties go to the heuristic default's code."""
    scores: dict[tuple, list[float]] = {}
    default_code = None
    usable = []
    for record in records:
        cands = [Candidate.from_json(c) for c in record["candidates"]]
        ok = [c for c in cands if c.status == "ok"]
        if ok:
            usable.append((record, cands, ok, min(c.ms for c in ok)))
        if default_code is None and record.get("default") is not None:
            d = cands[record["default"]]
            default_code = (tuple(sorted(d.code_options.items())), d.code_hash)
    codes = {(tuple(sorted(c.code_options.items())), c.code_hash) for _, _, ok, _ in usable for c in ok}
    if not codes:
        return None
    for code in codes:
        for _, _, ok, best in usable:
            mine = [c.ms for c in ok if (tuple(sorted(c.code_options.items())), c.code_hash) == code]
            scores.setdefault(code, []).append(math.log(min(mine) / best) if mine else math.inf)
    chosen = min(codes, key=lambda code: (sum(scores[code]) / len(scores[code]), code != default_code, code))
    return dict(chosen[0]), chosen[1]


def describe_record(spec, record: dict) -> str:
    key = record["key"]
    return (f"{spec.name} ({spec.source}), bucket {Bucket(key['heads_bucket'], key['tokens_bucket'])} "
            f"{key['dtype']}, GPU '{key['gpu']}'")


def skipped_note(cache: TuneCache) -> str:
    """The records of `cache` skipped as unusable, for an error that a record is missing."""
    return "".join(f"; {message}" for message in cache.messages)


def compile_tuned(spec, pipeline: str | None = None, *, mode: str = "auto", gpu: str | None = None,
                  shapes: Sequence[tuple[int, int]] = (), dtypes: Sequence[str] = ("bfloat16",),
                  cache: TuneCache | None = None, tune_missing: Callable | None = None):
    """Lower `spec` with its cached tuning (docs/autotuning.md). mode: "auto" (cached winners
    when present; missing requested buckets are tuned by tune_missing(spec, shape, dtype) when
    given), "frozen" (only cached results; a missing one raises TuningError naming it), "off"
    (the heuristic default, as without tuning). Returns (Compilation, ModulePlan)."""
    # xDSL: k3compile.ops imports this package, and its warm start must not load xDSL
    from k3compile.driver import lower

    plan = ModulePlan(pipeline)
    if mode != "off" and spec.kind == "latent_moe":
        return compile_moe_tuned(spec, plan, mode, gpu, cache or TuneCache()), plan
    if mode == "off" or not (tunable(spec, pipeline) or tunable(spec, pipeline, BACKWARD_ENTRY)):
        return lower(spec, pipeline), plan
    cache = cache or TuneCache()
    schedule = schedule_hash(spec, base_pipeline(spec, pipeline))
    if mode == "auto" and not shapes and gpu is None and not (cache.root / schedule[:16]).is_dir():
        return lower(spec, pipeline), plan  # nothing cached for this schedule (and torch stays unimported)
    gpu = gpu if gpu is not None else gpu_name()
    if gpu is None:
        if mode == "frozen":
            raise TuningError(f"--frozen: no GPU here (torch sees no CUDA device), and tuned configs are cached per "
                              f"GPU: pass --gpu NAME to embed those of GPU NAME for {spec.name} ({spec.source})")
        if shapes:
            plan.messages.append("no CUDA GPU here and no --gpu: the heuristic default, untuned")
        return lower(spec, pipeline), plan
    layer_heads = spec.params["num_v_heads"]
    records = []
    for batch, tokens in shapes:
        for dtype in dtypes:
            record = cache.get(key_for(spec, pipeline, (batch, tokens), dtype, gpu))
            if record is None and mode == "frozen":
                raise TuningError(f"frozen: no tuned config for {spec.name} ({spec.source}), bucket "
                                  f"{Bucket.of(batch, tokens, layer_heads)} {dtype} (shape {batch},{tokens}), GPU '{gpu}' "
                                  f"in {cache.root} (run `k3c tune {spec.source} --shape {batch},{tokens} --dtype {dtype}` "
                                  f"on that GPU){skipped_note(cache)}")
            if record is None and tune_missing is not None and gpu == gpu_name():
                record = tune_missing(spec, (batch, tokens), dtype).record
            if record is None:
                plan.messages.append(f"no tuned config for bucket {Bucket.of(batch, tokens, layer_heads)} {dtype} "
                                     f"on '{gpu}': the heuristic default there")
            else:
                records.append(record)
    # the backward's records (k3c tune --entry chunk_backward), where cached: never required, never
    # tuned here (its heuristic default where there is none)
    backward_records = []
    if shapes and tunable(spec, pipeline, BACKWARD_ENTRY):
        found = (cache.get(key_for(spec, pipeline, shape, dtype, gpu, BACKWARD_ENTRY))
                 for shape in shapes for dtype in dtypes)
        backward_records = [record for record in found if record is not None]
    if not shapes:
        cached = cached_records(spec, pipeline, gpu, cache)
        records, backward_records = cached.get(TUNED_ENTRY, []), cached.get(BACKWARD_ENTRY, [])
        if not records and not backward_records and mode == "frozen":
            raise TuningError(f"frozen: no tuned config for {spec.name} ({spec.source}), any bucket, GPU '{gpu}' "
                              f"in {cache.root} (run `k3c tune {spec.source} --shape B,T` on that GPU){skipped_note(cache)}")
    plan.messages.extend(cache.messages)
    by_entry = {entry: found for entry, found in ((TUNED_ENTRY, records), (BACKWARD_ENTRY, backward_records)) if found}
    if not by_entry:
        return lower(spec, pipeline), plan
    return embed_records(spec, plan, gpu, by_entry), plan


def compile_moe_tuned(spec, plan: ModulePlan, mode: str, gpu: str | None, cache: TuneCache):
    """A latent_moe module with the dispatch table of every token bucket cached for it on `gpu`
    (k3c tune --tokens); none cached: the default table ("frozen": an error naming the command)."""
    # xDSL: k3compile.ops imports this package, and its warm start must not load xDSL
    from k3compile.driver import lower

    schedule = schedule_hash(spec, base_pipeline(spec, plan.pipeline))
    if mode == "auto" and gpu is None and not (cache.root / schedule[:16]).is_dir():
        return lower(spec, plan.pipeline)  # nothing cached for this schedule (and torch stays unimported)
    gpu = gpu if gpu is not None else gpu_name()
    records = cached_records(spec, plan.pipeline, gpu, cache).get(MOE_ENTRY, []) if gpu is not None else []
    plan.messages.extend(cache.messages)
    if not records and mode == "frozen":
        raise TuningError(f"frozen: no tuned dispatch table for {spec.name} ({spec.source}) on GPU '{gpu}' in "
                          f"{cache.root} (run `k3c tune {spec.source} --tokens N` on that GPU){skipped_note(cache)}")
    if not records:
        return lower(spec, plan.pipeline)
    return embed_records(spec, plan, gpu, {MOE_ENTRY: records})


def cached_records(spec, pipeline: str | None, gpu: str, cache: TuneCache) -> dict[str, list[dict]]:
    """Every usable cached record of `spec`'s tuned entries on `gpu` under today's triton and
    k3compile (all buckets and dtypes), by entry; entries without one are left out. Where the
    schedule has no folder nothing more is read (k3compile.ops asks on every start)."""
    schedule = schedule_hash(spec, base_pipeline(spec, pipeline))
    if not (cache.root / schedule[:16]).is_dir():
        return {}
    versions = (triton_version(), k3compile_version())
    found = {entry: cache.records(schedule, gpu, *versions, entry=entry) for entry in CACHED_ENTRIES}
    return {entry: records for entry, records in found.items() if records}


def embed_records(spec, plan: ModulePlan, gpu: str, by_entry: dict[str, list[dict]]):
    """The module of `spec` under plan.pipeline with the records of each entry embedded: per
    entry one kernel code (choose_code) set on its passes, and its launch table per bucket
    (entry_table); plan's pipeline, tables, note and records say what was embedded."""
    # xDSL: k3compile.ops imports this package, and its warm start must not load xDSL
    from k3compile.backends.triton.printer import launch_table_name
    from k3compile.driver import lower

    plan.records = [record for found in by_entry.values() for record in found]
    by_entry = dict(by_entry)
    # a latent_moe layer's: its dispatch table, an option of lower-moe-experts (autotune/moe.py)
    table = moe_table(by_entry.pop(MOE_ENTRY, []))
    if table is not None:
        plan.pipeline = with_dispatch(spec, plan.pipeline, table)
        plan.note = (f"Autotuned (k3c tune) on '{gpu}': moe's dispatch table {table} (token buckets -> plan, "
                     "docs/moe.md).")
    if not by_entry:
        return lower(spec, plan.pipeline, note=plan.note)
    passes = split_pipeline(base_pipeline(spec, plan.pipeline))
    names = [name for name, _ in passes]
    codes = {}
    for entry, found in by_entry.items():  # each entry's kernel code, one for the module
        chosen = choose_code(found)
        codes[entry] = chosen[0] if chosen else {}
        owner = {c["option"]: c["pass"] for record in found for c in record.get("space", [])}
        for option, value in codes[entry].items():
            passes[names.index(owner[option])][1][option] = str(value)
    plan.pipeline = join_pipeline(passes)
    for entry, found in by_entry.items():
        plan.launch_tables[entry] = entry_table(spec, plan, entry, found, codes[entry])
    described = []
    for entry, table in plan.launch_tables.items():
        buckets = ", ".join(f"{d} {Bucket(h, t)}" for d, h, t in sorted(table))
        code = " ".join(f"{k}={v}" for k, v in codes[entry].items()) or "the pipeline's"
        described.append(f"`{entry}`: {len(table)} bucket(s): {buckets or 'none'}; kernel code {code}, launches\n"
                         f"read from {launch_table_name(entry)}.")
    plan.note = (
        f"Autotuned (k3c tune) on '{gpu}'. " + "\n".join(described) + "\n"
        "Kernel code (one choice per entry for the whole module): the code whose best candidate is\n"
        "closest to each tuned bucket's winner. Launch configs (block sizes, num_warps, num_stages) per\n"
        "bucket in the TUNED_* tables, read by the entry's launches; other sizes use the heuristic\n"
        "default; the bucket's P of segments=\"auto\" (context parallelism) under 'segments'. docs/autotuning.md\n"
        "has the design."
    )
    copies = {copy: copied_table(copy, plan.launch_tables[source]) for copy, source in COPIED_ENTRIES.items()
              if source in plan.launch_tables}
    return lower(spec, plan.pipeline, launch_tables={**plan.launch_tables, **copies}, note=plan.note)


def entry_table(spec, plan: ModulePlan, entry: str, records: list[dict], code_options: dict) -> dict:
    """The launch table of `entry` in a module of kernel code `code_options`: per record's bucket,
    the launch config of the fastest passing candidate with that code (and, for chunk, the
    bucket's P of segments="auto"); buckets without one are said in plan.messages."""
    # xDSL: k3compile.ops imports this package, and its warm start must not load xDSL
    from k3compile.driver import lower

    # the entry's kernel code as tune hashed it: its pipeline less the passes of other entries
    empty = lower(spec, entry_pipeline(plan.pipeline, entry), launch_tables={entry: {}})
    code_hash = kernel_code_hash(empty.source)
    table = {}
    for record in records:
        key = record["key"]
        cands = [Candidate.from_json(c) for c in record["candidates"]]
        mine = [c for c in cands if c.status == "ok" and c.code_options == code_options and c.code_hash == code_hash]
        if mine:
            # tuned under another name of the layer (a spec of `k3c tune`, k3compile.ops' own): its
            # kernels by this module's names; a record without its spec names them as this module
            tuned_layer = record.get("spec", {}).get("name", spec.name)
            launch = renamed_kernels(min(mine, key=lambda c: c.ms).launch, tuned_layer, spec.name)
            if record.get("segments"):  # the bucket's P for segments="auto", beside the kernels' configs
                launch = {**launch, "segments": {"P": record["segments"]["winner"]}}
            table[(key["dtype"], key["heads_bucket"], key["tokens_bucket"])] = launch
        else:
            what = describe_record(spec, record) + ("" if entry == TUNED_ENTRY else f" ({entry})")
            plan.messages.append(f"no passing tuned candidate with this module's kernel code for {what}: the "
                                 "heuristic default there")
    return table


def renamed_kernels(launch: dict, tuned_layer: str, layer: str) -> dict:
    """A launch config (kernel -> config) of the kernels of layer `tuned_layer`, named after
    `layer` (a kernel is <layer>_<role>)."""
    prefix = f"{tuned_layer}_"
    return {f"{layer}_{kernel.removeprefix(prefix)}" if kernel.startswith(prefix) else kernel: config
            for kernel, config in launch.items()}
