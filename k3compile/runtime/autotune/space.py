"""What the autotuner searches: the schedule choices of each tuned entry (Choice, SEARCH_SPACE for
`chunk`, BACKWARD_SEARCH_SPACE for `chunk_backward`), the context-parallel stage's segment counts
(SEGMENTS), the shape buckets that share tuned configs (Bucket), and the candidates: the product
of the space's values on top of a pipeline (less the passes that add only the other entries),
each with the options it sets, its kernel code (hash of its @triton.jit functions) and its
launch configs read from the IR.
"""

from __future__ import annotations

import ast
import hashlib
import itertools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from k3compile.default_pipelines import DEFAULT_PIPELINES
from k3compile.ir.copied_entries import SAVED_BACKWARD_ENTRY, SAVING_ENTRY, copied_kernel_name

TUNED_ENTRY = "chunk"  # the forward entry whose schedule choices are tuned
BACKWARD_ENTRY = "chunk_backward"  # the backward entry, tuned on its own (`k3c tune --entry`)
ENTRIES = (TUNED_ENTRY, BACKWARD_ENTRY)
# save-forward-values' entries (passes/save_forward_values.py): copies of the tuned entries whose
# kernels are named after the tuned ones (ir/copied_entries.py), so they read the tuned tables
# under those names
COPIED_ENTRIES = {SAVING_ENTRY: TUNED_ENTRY, SAVED_BACKWARD_ENTRY: BACKWARD_ENTRY}


def copied_table(copy: str, table: dict) -> dict:
    """The launch table of COPIED_ENTRIES' entry `copy`: its source's, each kernel renamed as the
    copy names it."""
    return {bucket: {copied_kernel_name(kernel, copy): config for kernel, config in kernels.items()}
            for bucket, kernels in table.items()}


MOE_ENTRY = "moe"  # the LatentMoE layer's dispatch table, tuned per token bucket (autotune/moe.py)
CACHED_ENTRIES = (*ENTRIES, MOE_ENTRY)  # the entries the cache holds records of


@dataclass(frozen=True)
class Choice:
    """One schedule choice: the values a pass option takes in the search, the first being the
    heuristic default (the pass's own default). launch_only: the option changes only how the
    kernels are launched (block-size constexprs, num_warps, num_stages; read back per kernel from
    the IR), so one compiled module serves all its values and a compiled module can switch
    between them per bucket; otherwise it changes kernel code and is chosen once per module."""

    pass_name: str
    option: str
    values: tuple[int, ...] | tuple[str, ...]
    launch_only: bool


# The search space of the chunk entry: the product of these values (options that a pipeline
# already sets, e.g. `-p '...,fuse-chunkwise{num-warps=4}'`, stay as set). To extend it, add a
# row: e.g. Choice("derive-chunkwise", "sub-chunk", (16, 32), launch_only=False), or
# Choice("fuse-chunkwise", "grouping", ("split", "split-prepare"), launch_only=False) (left out
# for now: statically its gram kernel still holds 239 registers, two programs per SM, and it
# doubles a cold tune; docs/chunk-performance.md).
SEARCH_SPACE: tuple[Choice, ...] = (
    # the choices the H200 sweeps showed to matter (bench/RESULTS.md); few, so that a new shape
    # tunes in seconds. Chunks of 64 were 0.4-0.6x the default at every bench shape: left out.
    # The scan's value blocks: 32 (twice the programs) was 3% faster at B2 T16384 H16, where 64
    # programs leave SMs idle (ab_attnres_s2_chunk_h16_decode_h200_8c8ba14.md). It replaced
    # scan-stages (3, 2): 2 won no bench shape or bucket since chunks of 16 (three tuning runs).
    Choice("derive-chunkwise", "chunk-size", (16, 32), launch_only=False),
    Choice("fuse-chunkwise", "num-warps", (4, 8), launch_only=True),
    Choice("fuse-chunkwise", "block-v", (64, 32), launch_only=True),
)

# The search space of the backward entry (`k3c tune --entry chunk_backward`). The backward saves
# nothing from the forward (k3compile.ops saves the inputs; derive-backward re-derives the chunk-
# local stages at its own chunk size), so its choices are independent of the forward's: its
# candidates are compiled without the forward's passes and the forward's config stays as tuned.
# Chunks of 32, value blocks of 32 and the gradients kernel at 4 warps (num-warps 2) lost on the
# H200 before scan-values=spill and gradients-forward=reload existed, which change the gradients
# kernel's register pressure (docs/backward.md), so all five are searched together. Candidate 0
# takes each pass's default wherever it is in the row (with_pass_defaults), so a default changed
# on a GPU A/B (scan-values) needs no edit here.
# num-warps: the prepare's and scans' warps, the gradients kernels' twice that; 8 (16 warps at 255
# registers) cannot launch. 32 candidates, 8 kernel codes. Left out: state-spill=float32 (9.6 ms
# against 7.7 at B4 T4096 H32) and gradients-maxnreg, whose "no cap" (0) a shared module cannot
# launch (the launch table merges a kernel's tuned config over the printed default, which has
# the cap; docs/autotuning.md).
BACKWARD_SEARCH_SPACE: tuple[Choice, ...] = (
    Choice("derive-backward", "chunk-size", (16, 32), launch_only=False),
    Choice("lower-backward", "scan-values", ("recompute", "spill"), launch_only=False),
    Choice("lower-backward", "gradients-forward", ("recompute", "reload"), launch_only=False),
    Choice("lower-backward", "num-warps", (4, 2), launch_only=True),
    Choice("lower-backward", "block-v", (64, 32), launch_only=True),
    Choice("lower-backward", "gradients-warps", (0, 16), launch_only=True),  # 0: twice num-warps
)

# The context-parallel stage after the search (a module with chunk_segments): the winner's launch
# config with every sequence split into P segments (chunk(..., segments=P)), each P checked
# before it is timed; P = 1 is the winner itself. The bucket's best P is what segments="auto" uses.
SEGMENTS: tuple[int, ...] = (2, 4, 8, 16)


# --- shape buckets ------------------------------------------------------------------------


def bucket(n: int) -> int:
    """The smallest power of two >= n (the generated module's _bucket is the same function)."""
    return 1 << max(int(n) - 1, 0).bit_length()


@dataclass(frozen=True)
class Bucket:
    """Sizes that share tuned configs: N*HV (sequences times value heads, the scan's parallel
    programs) and the tokens per sequence, each rounded up to a power of two."""

    heads: int
    tokens: int

    @classmethod
    def of(cls, batch: int, tokens: int, num_v_heads: int) -> Bucket:
        return cls(bucket(batch * num_v_heads), bucket(tokens))

    def __str__(self) -> str:
        return f"N*HV<={self.heads} T<={self.tokens}"


# --- pipelines and candidates ---------------------------------------------------------------


def split_pipeline(text: str) -> list[tuple[str, dict[str, str]]]:
    """'a,b{x=1 y=2}' -> [('a', {}), ('b', {'x': '1', 'y': '2'})]."""
    passes = []
    for item in re.findall(r"[^,{]+(?:\{[^}]*\})?", text):
        item = item.strip()
        if not item:
            continue
        name, _, rest = item.partition("{")
        options = dict(o.split("=", 1) for o in rest.rstrip("}").split() if "=" in o)
        passes.append((name.strip(), options))
    return passes


def join_pipeline(passes: list[tuple[str, dict[str, str]]]) -> str:
    return ",".join(name + (f"{{{' '.join(f'{k}={v}' for k, v in opts.items())}}}" if opts else "")
                    for name, opts in passes)


@dataclass
class Candidate:
    index: int
    options: dict[str, int | str]  # option -> value, one per Choice
    pipeline: str
    code_options: dict[str, int | str]  # the options that change kernel code (one module per value)
    code_hash: str = ""  # hash of the generated @triton.jit functions
    launch: dict | None = None  # kernel -> launch config read from the IR
    status: str = "pending"  # ok, wrong, unwritten, error, compile error, same as #i
    ms: float = math.inf
    detail: str = ""

    def to_json(self) -> dict:
        return {"index": self.index, "options": self.options, "pipeline": self.pipeline,
                "code_options": self.code_options, "code_hash": self.code_hash, "launch": self.launch,
                "status": self.status, "ms": self.ms if math.isfinite(self.ms) else None, "detail": self.detail}

    @classmethod
    def from_json(cls, data: dict) -> Candidate:
        data = dict(data)
        data["ms"] = math.inf if data.get("ms") is None else data["ms"]
        return cls(**data)

    @property
    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.options.items())


# Passes that add only the backward entries (chunk_backward and its segments): the tuned chunk
# entry is the same without them, so the candidates' pipelines and the kernel code hash leave them
# out (a third of a candidate's compile); the module built with the winners has them.
# save-forward-values (chunk_saving, chunk_backward_saved: copies of the tuned entries) is in both
# sets: neither entry's candidates need it.
BACKWARD_PASSES = frozenset({"derive-backward", "lower-backward", "derive-segment-scan-backward",
                             "save-forward-values"})


# Passes that add only entries other than chunk_backward (the forward's chunk, recurrent, decode,
# segments, speculative): the backward's candidates are compiled without them (derive-backward
# derives from the k3.recurrence, not from the chunk entry). derive-segment-scan-backward adds
# chunk_backward_segments, which needs the forward's chunk_segments. Passes in neither set
# (outline-kernels, overlap-launches) stay in both.
FORWARD_PASSES = frozenset({"lower-recurrent", "lower-decode", "derive-chunkwise", "fuse-chunkwise",
                            "derive-segment-scan", "lower-segment-scan", "derive-segment-scan-backward",
                            "derive-replay", "lower-speculative", "save-forward-values"})


def tuned_entry_pipeline(pipeline: str) -> str:
    """`pipeline` without the passes that only add backward entries."""
    return join_pipeline([p for p in split_pipeline(pipeline) if p[0] not in BACKWARD_PASSES])


def backward_entry_pipeline(pipeline: str) -> str:
    """`pipeline` without the passes that only add the forward's entries."""
    return join_pipeline([p for p in split_pipeline(pipeline) if p[0] not in FORWARD_PASSES])


def entry_pipeline(pipeline: str, entry: str = TUNED_ENTRY) -> str:
    """What `entry`'s candidates compile: `pipeline` less the passes that add only other entries."""
    return backward_entry_pipeline(pipeline) if entry == BACKWARD_ENTRY else tuned_entry_pipeline(pipeline)


def space_for(entry: str) -> tuple[Choice, ...]:
    """The default search space of a tuned entry."""
    if entry not in ENTRIES:
        raise ValueError(f"the tuned entries are {', '.join(ENTRIES)}, got {entry!r}")
    return BACKWARD_SEARCH_SPACE if entry == BACKWARD_ENTRY else SEARCH_SPACE


def pass_default(choice: Choice):
    """The default of the choice's pass option (None: no such pass or option)."""
    # xDSL: k3compile.ops imports this package, and its warm start must not load xDSL
    from k3compile.passes import PASSES

    factory = PASSES.get(choice.pass_name)
    return None if factory is None else getattr(factory(), choice.option.replace("-", "_"), None)


def with_pass_defaults(space: Sequence[Choice]) -> tuple[Choice, ...]:
    """The space with each choice's pass default moved to the front where it is among the values:
    candidate 0 of a built-in space stays the heuristic default when a pass's default changes
    (on a GPU A/B) before the table follows. Spaces a caller passes are used as given."""
    result = []
    for choice in space:
        default = pass_default(choice)
        if default in choice.values and choice.values[0] != default:
            choice = replace(choice, values=(default, *(v for v in choice.values if v != default)))
        result.append(choice)
    return tuple(result)


def candidates(pipeline: str, space: Sequence[Choice] | None = None, entry: str = TUNED_ENTRY) -> list[Candidate]:
    """Every combination of the space's values (the built-in space's with each pass default first,
    with_pass_defaults) on top of `pipeline` (less the passes that add only other entries than `entry`); options the
    pipeline sets itself are kept. Empty when the pipeline has none of the space's passes."""
    space = with_pass_defaults(space_for(entry)) if space is None else space
    passes = split_pipeline(entry_pipeline(pipeline, entry))
    names = [name for name, _ in passes]
    axes = []
    for choice in space:
        if choice.pass_name not in names:
            continue
        given = passes[names.index(choice.pass_name)][1].get(choice.option)
        axes.append((choice, (type(choice.values[0])(given),) if given is not None else choice.values))
    if not axes:
        return []
    result = []
    for values in itertools.product(*(vals for _, vals in axes)):
        chosen = [(passes[names.index(c.pass_name)][0], c, v) for (c, _), v in zip(axes, values)]
        new = [(name, dict(opts)) for name, opts in passes]
        for pass_name, choice, value in chosen:
            new[names.index(pass_name)][1][choice.option] = str(value)
        result.append(Candidate(
            index=len(result),
            options={c.option: v for _, c, v in chosen},
            pipeline=join_pipeline(new),
            code_options={c.option: v for _, c, v in chosen if not c.launch_only},
        ))
    return result


def kernel_code_hash(source: str) -> str:
    """Hash of a module's @triton.jit functions without their docstrings (which describe the
    kernel op, launch attributes included) and names (the layer's name prefixes every kernel's:
    one layer under two names, a spec of `k3c tune` and k3compile.ops' own, has one code): equal
    hashes mean equal kernel code."""
    parts = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and any(ast.unparse(d).startswith("triton.jit") for d in node.decorator_list):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
                node.body = body[1:] or [ast.Pass()]
            node.name = "kernel"
            parts.append(ast.unparse(node))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def module_code_hash(source: str) -> str:
    """Hash of a whole generated module without its docstrings (the module's names the pipeline):
    equal hashes mean the same program, host code included, whatever options made it (GLA's
    backward is the same module under scan-values=spill, which shares nothing with its scans)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return hashlib.sha256(ast.dump(tree).encode()).hexdigest()[:16]


def launch_configs(compilation, entry_name: str = TUNED_ENTRY) -> dict[str, dict[str, int]]:
    """kernel -> launch config (block sizes, num_warps, num_stages) of an entry, read from the IR
    after the backend's passes (driver.schedule_for_triton): compilation.scheduled."""
    # xDSL: k3compile.ops imports this package, and its warm start must not load xDSL
    from k3compile.backends.triton.launch import entry_launch_configs

    return entry_launch_configs(compilation.scheduled, entry_name)


def has_entry(compilation, entry_name: str = TUNED_ENTRY) -> bool:
    # xDSL: k3compile.ops imports this package, and its warm start must not load xDSL
    from k3compile.ir import k3s

    return any(isinstance(op, k3s.EntryOp) and op.sym_name.data == entry_name for op in compilation.scheduled.ops)


def base_pipeline(spec, pipeline: str | None) -> str:
    return DEFAULT_PIPELINES[spec.kind] if pipeline is None else pipeline


def tunable(spec, pipeline: str | None = None, entry: str = TUNED_ENTRY) -> bool:
    return spec.is_recurrence and bool(candidates(base_pipeline(spec, pipeline), space_for(entry), entry))
