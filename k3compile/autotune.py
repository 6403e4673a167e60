"""Autotuning of the chunk entry's schedule choices on the GPU, with an on-disk cache.

The search space is SEARCH_SPACE: a table of pass options that change the chunk entry. For
every shape bucket (tune) each candidate pipeline is compiled, run with NaN-filled outputs
(the module's POISON_OUTPUTS) and checked against the float64 reference (k3compile.ir.reference)
on a small shape, checked to write every output at the target shape, and only then timed
there; compile failures, out-of-resources and wrong results score infinity and are reported.
The result of a bucket is cached on disk (TuneCache) under a key of the schedule (layer IR +
pipeline), the bucket, the dtype, the GPU, and the triton and k3compile versions, so a later
tune or compile times nothing. compile_tuned() turns cached results into a module: one chunk
size for the module (it changes kernel code), and a launch table per bucket (block sizes,
num_warps, num_stages) that the generated launches read. docs/autotuning.md has the design.

The timer and the GPU name are parameters (defaults: `time_candidate`, `gpu_name`) so that the
CPU tests run the whole search in Triton's interpreter with a fake timer.
"""

from __future__ import annotations

import ast
import hashlib
import itertools
import json
import math
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from k3compile.errors import K3Error
from k3compile.ir.choices import DTYPES

TUNED_ENTRY = "chunk"  # the entry whose schedule choices are tuned


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
    # tunes in seconds. Chunks of 64 were 0.4-0.6x the default at every bench shape: left out
    Choice("derive-chunkwise", "chunk-size", (16, 32), launch_only=False),
    Choice("fuse-chunkwise", "num-warps", (4, 8), launch_only=True),
    Choice("fuse-chunkwise", "scan-stages", (3, 2), launch_only=True),
)

# The context-parallel stage after the search (a module with chunk_segments): the winner's launch
# config with every sequence split into P segments (chunk(..., segments=P)), each P checked
# before it is timed; P = 1 is the winner itself. The bucket's best P is what segments="auto" uses.
SEGMENTS: tuple[int, ...] = (2, 4, 8, 16)

DEFAULT_CHECK_SHAPE = None  # (B, T) of the reference check; None: check_shape_for(the target)
BENCH_WARMUP_MS, BENCH_REP_MS = 10, 40  # triton.testing.do_bench per candidate


class TuningError(K3Error):
    """Tuning cannot run, or (frozen) a needed tuned config is not in the cache."""


# --- environment: GPU, versions, cache folder --------------------------------------------------


def gpu_name() -> str | None:
    """The CUDA device's name, None without one."""
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def triton_version() -> str:
    import triton

    return triton.__version__


_SOURCE_HASH: list[str] = []


def k3compile_version() -> str:
    """__version__ plus a hash of the package's source (passes, printer, IR): tuned winners
    belong to the kernel code that was timed, and a working tree changes it between releases."""
    import importlib

    import k3compile

    if not _SOURCE_HASH:
        digest = hashlib.sha256()
        for package in ("k3compile", "k3compile.ir", "k3compile.passes", "k3compile.backends"):
            root = Path(importlib.import_module(package).__path__[0])
            for path in sorted(root.rglob("*.py")):
                if package == "k3compile" and path.parent != root:
                    continue
                digest.update(f"{package}/{path.relative_to(root)}\0".encode())
                digest.update(path.read_bytes())
        _SOURCE_HASH.append(digest.hexdigest()[:12])
    return f"{k3compile.__version__}+src.{_SOURCE_HASH[0]}"


def cache_root(override: str | Path | None = None) -> Path:
    """k3compile's cache folder: the override (CLI --cache-dir), else $K3C_CACHE_DIR, else
    $XDG_CACHE_HOME/k3compile, else ~/.cache/k3compile. Tuning results live in its autotune/."""
    if override:
        return Path(override)
    if os.environ.get("K3C_CACHE_DIR"):
        return Path(os.environ["K3C_CACHE_DIR"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg) / "k3compile" if xdg else Path.home() / ".cache" / "k3compile"


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


def candidates(pipeline: str, space: Sequence[Choice] | None = None) -> list[Candidate]:
    """Every combination of the space's values on top of `pipeline`; options the pipeline sets
    itself are kept. Empty when the pipeline has none of the space's passes."""
    space = SEARCH_SPACE if space is None else space
    passes = split_pipeline(pipeline)
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
    kernel op, launch attributes included): equal hashes mean equal kernel code."""
    parts = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and any(ast.unparse(d).startswith("triton.jit") for d in node.decorator_list):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
                node.body = body[1:] or [ast.Pass()]
            parts.append(ast.unparse(node))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def launch_configs(compilation, entry_name: str = TUNED_ENTRY) -> dict[str, dict[str, int]]:
    """kernel -> launch config (block sizes, num_warps, num_stages) of an entry, from the IR."""
    from k3compile.backends.triton.printer import EntryView, TritonPrinter
    from k3compile.ir import k3s

    entry = next(op for op in compilation.scheduled.ops
                 if isinstance(op, k3s.EntryOp) and op.sym_name.data == entry_name)
    view, printer = EntryView(entry), TritonPrinter()
    return {kernel.sym_name.data: printer.launch_config(kernel, view) for kernel in view.kernels}


def has_entry(compilation, entry_name: str = TUNED_ENTRY) -> bool:
    from k3compile.ir import k3s

    return any(isinstance(op, k3s.EntryOp) and op.sym_name.data == entry_name for op in compilation.scheduled.ops)


# --- cache ------------------------------------------------------------------------------------


def schedule_hash(spec, pipeline: str) -> str:
    """Hash of the printed schedule IR before tuning: the spec's layer op and the pipeline."""
    from k3compile.frontend import spec_to_module

    text = f"{spec_to_module(spec)}\n// pipeline: {pipeline}\n"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def cache_key(schedule: str, bucket_: Bucket, dtype: str, gpu: str, triton: str, k3c: str) -> dict:
    return {"schedule": schedule, "heads_bucket": bucket_.heads, "tokens_bucket": bucket_.tokens, "dtype": dtype,
            "gpu": gpu, "triton": triton, "k3compile": k3c}


def key_for(spec, pipeline: str | None, shape: tuple[int, int], dtype: str, gpu: str) -> dict:
    """The cache key of tuning `spec` (under `pipeline`, None: the kind's) for shape (B, T)."""
    from k3compile.frontend import spec_to_module

    heads = next(iter(spec_to_module(spec).ops)).num_v_heads.value.data
    return cache_key(schedule_hash(spec, base_pipeline(spec, pipeline)), Bucket.of(shape[0], shape[1], heads), dtype,
                     gpu, triton_version(), k3compile_version())


def key_digest(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]


def write_atomic(path: Path, text: str) -> None:
    """Write via a temporary file in the same folder and a rename: readers see the old file or
    the new one, never half of one (two tuning processes may race; the last rename wins)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class TuneCache:
    """<root>/autotune/<schedule hash>/<key hash>.json, one record per (schedule, bucket,
    dtype, GPU, triton, k3compile)."""

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = cache_root(root) / "autotune"

    def path(self, key: dict) -> Path:
        return self.root / key["schedule"][:16] / f"{key_digest(key)}.json"

    def get(self, key: dict) -> dict | None:
        try:
            record = json.loads(self.path(key).read_text())
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) and record.get("key") == key else None

    def put(self, record: dict) -> Path:
        path = self.path(record["key"])
        write_atomic(path, json.dumps(record, indent=1))
        return path

    def records(self, schedule: str, gpu: str, triton: str, k3c: str) -> list[dict]:
        """Every cached record of a schedule on a GPU with these versions (all buckets, dtypes)."""
        found = []
        for path in sorted((self.root / schedule[:16]).glob("*.json")):
            try:
                record = json.loads(path.read_text())
                key = record["key"]
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if (key.get("schedule"), key.get("gpu"), key.get("triton"), key.get("k3compile")) == (schedule, gpu, triton, k3c):
                found.append(record)
        return found


# --- inputs -----------------------------------------------------------------------------------


def timing_inputs(layer_op, batch: int, tokens: int, dtype, device: str, seed: int = 0) -> dict:
    """Random inputs of the target shape drawn on the device (fast at prefill sizes), with the
    meaning of k3compile.verify.recurrence_inputs: unit q/k unless the kernel normalises, log
    decays clamped at -5 (or raw gate projections and the gate's parameters), beta in (0, 1) or
    logits, an fp32 initial state."""
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
    from k3compile.backends.triton.printer import launch_table_name

    setattr(module, launch_table_name(entry_name), EveryBucket(launch))


def run_entry(module, inputs: dict, candidate: Candidate, entry_name: str = TUNED_ENTRY, **options):
    """One call of the tuned entry with the candidate's launch config set: (o, final_state).
    options: more arguments of the call (segments=P). Tests replace this to make a candidate wrong."""
    set_launch(module, candidate.launch, entry_name)
    return getattr(module, entry_name)(**inputs, output_final_state=True, **options)


def time_candidate(fn: Callable[[], object], candidate: Candidate) -> float:
    """Milliseconds of fn on the GPU (median of triton.testing.do_bench)."""
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
    from concurrent.futures import ThreadPoolExecutor

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
                            run_entry(module, inputs, candidate, entry_name)
                        except Exception:  # noqa: BLE001 - reported by the real run
                            pass
    finally:
        for module, poison, kernels in saved:
            for name, kernel in kernels.items():
                setattr(module, name, kernel)
            module.POISON_OUTPUTS = poison


@dataclass
class TuneResult:
    record: dict
    cached: bool  # found in the cache: nothing compiled or timed
    seconds: float  # wall time of this call
    timed: int  # calls of the timer
    path: Path | None = None
    messages: list[str] = field(default_factory=list)

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


def base_pipeline(spec, pipeline: str | None) -> str:
    from k3compile.pipeline import DEFAULT_PIPELINES

    return DEFAULT_PIPELINES[spec.kind] if pipeline is None else pipeline


def tunable(spec, pipeline: str | None = None) -> bool:
    return spec.is_recurrence and bool(candidates(base_pipeline(spec, pipeline), SEARCH_SPACE))


def check_shape_for(tokens: int) -> tuple[int, int]:
    """The reference check's (B, T): two sequences of several chunks of 64 and 32 and a partial
    one, T divisible by 16 exactly when the target's is (Triton specialises integer arguments
    on that), so the check and the timing share compiled kernels."""
    return (2, 1 if tokens == 1 else 144 if tokens % 16 == 0 else 150)


def parse_dtype(name: str):
    import torch

    if name not in DTYPES:
        raise TuningError(f"dtype must be one of {', '.join(DTYPES)}, got {name!r}")
    return getattr(torch, name)


def tune(spec, shape: tuple[int, int], dtype: str = "bfloat16", *, pipeline: str | None = None,
         gpu: str | None = None, timer: Callable | None = None, cache: TuneCache | None = None,
         space: Sequence[Choice] | None = None, check_shape: tuple[int, int] | None = None,
         retune: bool = False, jobs: int | None = None, segments: Sequence[int] | None = None,
         progress: Callable[[int, int, str], None] | None = None) -> TuneResult:
    """Tune the chunk entry of `spec` for the bucket of shape (B, T) and dtype, then the
    context-parallel stage (P of `segments`, default SEGMENTS); cached results are returned
    without compiling or timing anything (unless retune)."""
    from k3compile.driver import load_module, lower
    from k3compile.frontend import spec_to_module

    start = time.perf_counter()
    space = SEARCH_SPACE if space is None else space
    check_shape = check_shape or DEFAULT_CHECK_SHAPE or check_shape_for(shape[1])
    torch_dtype = parse_dtype(dtype)
    pipeline = base_pipeline(spec, pipeline)
    if not spec.is_recurrence:
        raise TuningError(f"{spec.source}: kind '{spec.kind}' has no chunk entry to tune")
    found = candidates(pipeline, space)
    if not found:
        raise TuningError(f"{spec.source}: pipeline '{pipeline}' has none of the tuned passes "
                          f"({', '.join(sorted({c.pass_name for c in space}))})")
    gpu = gpu if gpu is not None else gpu_name()
    if gpu is None:
        raise TuningError("no CUDA GPU here: tuning times the kernels on the GPU they will run on")
    batch, tokens = shape
    if batch < 1 or tokens < 1:
        raise TuningError(f"shape B,T must be positive, got {batch},{tokens}")
    layer_op = next(iter(spec_to_module(spec).ops))
    cache = cache or TuneCache()
    key = key_for(spec, pipeline, shape, dtype, gpu)
    if not retune:
        record = cache.get(key)
        if record is not None:
            return TuneResult(record, True, time.perf_counter() - start, 0, cache.path(key))

    import torch

    from k3compile.verify import RecurrenceCase, compare, recurrence_inputs, tolerance
    from k3compile.ir import reference

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
    for cand in found:
        try:
            compilation = lower(spec, cand.pipeline, launch_tables={TUNED_ENTRY: {}})
            if not has_entry(compilation):
                raise TuningError(f"pipeline '{cand.pipeline}' has no '{TUNED_ENTRY}' entry")
            cand.code_hash = kernel_code_hash(compilation.source)
            cand.launch = launch_configs(compilation)
            sources[cand.index] = compilation.source
        except Exception as err:  # noqa: BLE001 - a candidate that does not compile scores infinity
            cand.status, cand.detail = "compile error", short(err)
    groups: dict[tuple, list[Candidate]] = {}
    for cand in found:
        if cand.status == "pending":
            group = groups.setdefault((tuple(sorted(cand.code_options.items())), cand.code_hash), [])
            same = next((c for c in group if c.launch == cand.launch), None)
            if same is not None:  # e.g. block-v 128 when V = 64: the launch of block-v 64
                cand.status, cand.detail = f"same as #{same.index}", "same kernel code and launch config"
            else:
                group.append(cand)
    phases["compile"] = time.perf_counter() - t0

    # 2. one module per kernel code; the reference once
    check_case = RecurrenceCase("tune check", check_shape[0], check_shape[1])
    check = recurrence_inputs(layer_op, check_case, torch_dtype, device, torch.Generator().manual_seed(1234))
    t0 = time.perf_counter()
    ref_o, ref_state = reference.recurrence(layer_op, **check, output_final_state=True)
    phases["check"] += time.perf_counter() - t0
    target = timing_inputs(layer_op, batch, tokens, torch_dtype, device)
    tol = tolerance(TUNED_ENTRY, torch_dtype)
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
                precompile(modules, TUNED_ENTRY, [check, target], jobs or min(32, os.cpu_count() or 1))
            except Exception:  # noqa: BLE001 - only a speed-up: the runs below compile what is missing
                pass
            phases["precompile"] += time.perf_counter() - t0
        def check_and_time(module, cand: Candidate, **options) -> tuple[str, float, str]:
            """(status, ms, detail) of one call of the entry: NaN-poisoned outputs checked against the
            reference, every output written at the target shape, only then timed; any error scores
            infinity (out of resources, launch errors)."""
            t0 = time.perf_counter()
            try:
                module.POISON_OUTPUTS = True  # unwritten elements stay NaN and fail
                o, state = run_entry(module, check, cand, **options)
                errors = [(name, compare(out, ref)) for name, out, ref in (("o", o, ref_o), ("final_state", state, ref_state))]
                bad = [(name, rms) for name, (_, rms) in errors if not (math.isfinite(rms) and rms <= tol)]
                if bad:
                    name, rms = bad[0]
                    return "wrong", math.inf, (f"{name}: NaN (unwritten elements or a blow-up)" if math.isnan(rms)
                                               else f"{name}: RMS ratio {rms:.1e} > {tol:.0e}")
                o, state = run_entry(module, target, cand, **options)
                if not (bool(torch.isfinite(o).all()) and bool(torch.isfinite(state).all())):
                    return "unwritten", math.inf, "NaN in the outputs at the target shape"
            except Exception as err:  # noqa: BLE001
                return "error", math.inf, short(err)
            finally:
                phases["check"] += time.perf_counter() - t0
            t0 = time.perf_counter()
            try:
                module.POISON_OUTPUTS = False
                timed_as = replace(cand, options={**cand.options, **options})  # what the timer is told
                ms = float(timed_call(lambda: run_entry(module, target, cand, **options), timed_as))
            except Exception as err:  # noqa: BLE001
                return "error", math.inf, short(err)
            finally:
                phases["time"] += time.perf_counter() - t0
            if math.isfinite(ms) and ms > 0:
                return "ok", ms, ""
            return "error", math.inf, f"timer returned {ms}"

        for module, group in modules:
            for cand in group:
                cand.status, cand.ms, cand.detail = check_and_time(module, cand)
                if cand.status == "ok":
                    best.append(cand)
                done += 1
                report(done)
            sys.modules.pop(module.__name__, None)
        ok = [c for c in found if c.status == "ok"]
        winner = min(ok, key=lambda c: c.ms) if ok else None
        segments_record = None
        module = next((m for m, group in modules if winner in group), None)
        if winner is not None and hasattr(module, "_CHUNK_CP"):
            rows = [{"P": 1, "status": "ok", "ms": winner.ms, "detail": "the winner"}]
            for P in SEGMENTS if segments is None else segments:
                status, ms, detail = check_and_time(module, winner, segments=P)
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
        "segments": segments_record,  # the context-parallel stage (SEGMENTS), None without one
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


# --- compiling with tuned configs -------------------------------------------------------------


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


def compile_tuned(spec, pipeline: str | None = None, *, mode: str = "auto", gpu: str | None = None,
                  shapes: Sequence[tuple[int, int]] = (), dtypes: Sequence[str] = ("bfloat16",),
                  cache: TuneCache | None = None, tune_missing: Callable | None = None):
    """Lower `spec` with its cached tuning (docs/autotuning.md). mode: "auto" (cached winners
    when present; missing requested buckets are tuned by tune_missing(spec, shape, dtype) when
    given), "frozen" (only cached results; a missing one raises TuningError naming it), "off"
    (the heuristic default, as without tuning). Returns (Compilation, ModulePlan)."""
    from k3compile.backends.triton.printer import launch_table_name
    from k3compile.driver import lower
    from k3compile.frontend import spec_to_module

    plan = ModulePlan(pipeline)
    if mode == "off" or not tunable(spec, pipeline):
        return lower(spec, pipeline), plan
    base = base_pipeline(spec, pipeline)
    cache = cache or TuneCache()
    schedule = schedule_hash(spec, base)
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
    versions = (triton_version(), k3compile_version())
    layer_heads = next(iter(spec_to_module(spec).ops)).num_v_heads.value.data
    records = []
    for batch, tokens in shapes:
        for dtype in dtypes:
            record = cache.get(key_for(spec, pipeline, (batch, tokens), dtype, gpu))
            if record is None and mode == "frozen":
                raise TuningError(f"frozen: no tuned config for {spec.name} ({spec.source}), bucket "
                                  f"{Bucket.of(batch, tokens, layer_heads)} {dtype} (shape {batch},{tokens}), GPU '{gpu}' "
                                  f"in {cache.root} (run `k3c tune {spec.source} --shape {batch},{tokens} --dtype {dtype}` "
                                  "on that GPU)")
            if record is None and tune_missing is not None and gpu == gpu_name():
                record = tune_missing(spec, (batch, tokens), dtype).record
            if record is None:
                plan.messages.append(f"no tuned config for bucket {Bucket.of(batch, tokens, layer_heads)} {dtype} "
                                     f"on '{gpu}': the heuristic default there")
            else:
                records.append(record)
    if not shapes:
        records = cache.records(schedule, gpu, *versions)
        if not records and mode == "frozen":
            raise TuningError(f"frozen: no tuned config for {spec.name} ({spec.source}), any bucket, GPU '{gpu}' "
                              f"in {cache.root} (run `k3c tune {spec.source} --shape B,T` on that GPU)")
    if not records:
        return lower(spec, pipeline), plan
    plan.records = records
    chosen = choose_code(records)
    code_options = chosen[0] if chosen else {}
    passes = split_pipeline(base)
    names = [name for name, _ in passes]
    owner = {c["option"]: c["pass"] for record in records for c in record.get("space", [])}
    for option, value in code_options.items():
        passes[names.index(owner[option])][1][option] = str(value)
    plan.pipeline = join_pipeline(passes)
    empty = lower(spec, plan.pipeline, launch_tables={TUNED_ENTRY: {}})
    code_hash = kernel_code_hash(empty.source)
    table = {}
    untuned = []
    for record in records:
        key = record["key"]
        cands = [Candidate.from_json(c) for c in record["candidates"]]
        mine = [c for c in cands if c.status == "ok" and c.code_options == code_options and c.code_hash == code_hash]
        if mine:
            launch = min(mine, key=lambda c: c.ms).launch
            if record.get("segments"):  # the bucket's P for segments="auto", beside the kernels' configs
                launch = {**launch, "segments": {"P": record["segments"]["winner"]}}
            table[(key["dtype"], key["heads_bucket"], key["tokens_bucket"])] = launch
        else:
            untuned.append(describe_record(spec, record))
    for what in untuned:
        plan.messages.append(f"no passing tuned candidate with this module's kernel code for {what}: the heuristic "
                             "default there")
    plan.launch_tables = {TUNED_ENTRY: table}
    buckets = ", ".join(f"{d} {Bucket(h, t)}" for d, h, t in sorted(table))
    code = " ".join(f"{k}={v}" for k, v in code_options.items()) or "the pipeline's"
    plan.note = (
        f"Autotuned (k3c tune) on '{gpu}' for {len(table)} bucket(s): {buckets or 'none'}.\n"
        f"Kernel code (one choice for the whole module, {code}): the code whose best candidate is\n"
        "closest to each tuned bucket's winner. Launch configs (block sizes, num_warps, num_stages) per\n"
        f"bucket in {launch_table_name(TUNED_ENTRY)}, read by the launches of `{TUNED_ENTRY}`; other sizes use the heuristic\n"
        "default; the bucket's P of segments=\"auto\" (context parallelism) under 'segments'. docs/autotuning.md\n"
        "has the design."
    )
    return lower(spec, plan.pipeline, launch_tables=plan.launch_tables, note=plan.note), plan
