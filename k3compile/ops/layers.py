"""The compiled layers behind k3compile.ops: one generated module per kernel-determining key,
compiled on first use and kept in process (a dict) and on disk.

The key holds what determines the kernels — kind, heads, head dims, state layout, the input
options — and a fingerprint of the compiler's own source, so an edited compiler never reuses a
stale module. Batch size, sequence length, dtype and scale are run-time arguments of the module,
so they never recompile. A recurrence's module embeds the tuning cache's winners of its layer on
this GPU (`k3c tune`, k3compile.ops.tuning(); docs/autotuning.md), and its file name a digest of
them. A module found on disk is imported directly: no xDSL, no passes. Its first line holds a
hash of the rest, checked on every load: a file that fails it (empty, truncated, overwritten) is
compiled and written again, never imported.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
import warnings
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from types import ModuleType

from k3compile.default_pipelines import DEFAULT_PIPELINES
from k3compile.errors import OutputError
from k3compile.ops.pipeline_options import chosen, pipeline_with
from k3compile.runtime.autotune.cache import TuneCache
from k3compile.runtime.autotune.compile import ModulePlan, cached_records, embed_records
from k3compile.runtime.autotune.measure import gpu_name

# the packages whose source makes a module: driver, IR, passes, printer (k3compile.ops is inside
# the first; an edit there costs a recompile, never a stale module)
COMPILER_PACKAGES = ("k3compile", "k3compile.ir", "k3compile.passes", "k3compile.backends")


@dataclass(frozen=True)
class LayerKey:
    """What the kernels of a layer depend on: a spec table without name, scale and dtype."""

    kind: str
    num_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    state_layout: str = "kv"
    qk_l2norm: bool = False
    gate_input: str = "log"
    gate_lower_bound: float = -5.0  # read by the clamped and bounded gates only
    beta_input: str = "probability"

    def module_name(self) -> str:
        """A Python identifier naming the layer and, by a digest, its key and the compiler."""
        text = json.dumps({**asdict(self), "compiler": compiler_fingerprint()}, sort_keys=True)
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        return (f"{self.kind}_h{self.num_heads}_hv{self.num_v_heads}_k{self.head_k_dim}_v{self.head_v_dim}"
                f"_{digest}")

    def table(self) -> dict:
        """The `[layer]` table of k3compile.spec.spec_from_table (dtype and scale left at their
        defaults: the module takes both at run time)."""
        return {"name": self.module_name(), **asdict(self)}


def source_fingerprint(roots: Iterable[Path]) -> str:
    """A digest of every .py file under the roots: names and contents."""
    digest = hashlib.sha256()
    for root in roots:
        for path in sorted(Path(root).rglob("*.py")):
            digest.update(path.relative_to(root).as_posix().encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


@cache
def compiler_fingerprint() -> str:
    """source_fingerprint of the installed compiler packages (found without importing them:
    k3compile.ir & co. import xDSL)."""
    roots = []
    for package in COMPILER_PACKAGES:
        roots.extend(importlib.util.find_spec(package).submodule_search_locations)
    return source_fingerprint(roots)


def cache_dir() -> Path:
    """k3compile.driver.default_cache_dir() / "ops". Spelled out here: k3compile.driver imports
    xDSL, which a warm cache must not."""
    root = os.environ.get("K3C_CACHE_DIR") or os.path.join("~", ".cache", "k3compile")
    return Path(root).expanduser() / "modules" / "ops"


# a cached module's first line: this prefix, then the sha256 of everything after that line
HASH_PREFIX = b"# k3compile.ops module, sha256 of the rest: "

# by key and the pass options in force (k3compile.ops.pass_options)
_LOADED: dict[tuple[LayerKey, str], ModuleType] = {}


def layer_module(key: LayerKey) -> ModuleType:
    """The generated module of `key` under the pass options in force (pipeline_options.chosen): from
    this process, else from the disk cache, else compiled (and written there atomically, so
    processes side by side never see half a file), with the tuned winners of its layer on this
    GPU embedded (tuned_records) as of its first use here, unless options were chosen."""
    options = chosen()
    module = _LOADED.get((key, options))
    if module is None:
        spec = layer_spec(key)
        gpu, records = (None, {}) if options else tuned_records(spec)
        stem = module_stem(key, records, options)
        path = cache_dir() / f"{stem}.py"
        source = read_cached(path)
        if source is None:
            source = compile_layer(spec, path, gpu, records, options)
        module = _LOADED[(key, options)] = import_module(path, source, f"k3compile_ops_{stem}")
    return module


def forget_if_retuned(key: LayerKey) -> None:
    """Forget the loaded module of `key` (under the default options: the tuner's) where the tuning
    cache's records of its layer have changed since it was loaded (a tune in this process, or
    `k3c tune` beside it): its next call loads the module that embeds them."""
    module = _LOADED.get((key, ""))
    if module is None:
        return
    _, records = tuned_records(layer_spec(key))
    if module.__name__ != f"k3compile_ops_{module_stem(key, records)}":
        del _LOADED[(key, "")]


def layer_spec(key: LayerKey):
    """The spec k3compile.ops compiles for `key` (a recurrence's LayerKey, or the AttnRes and
    MoE keys of k3compile.ops.attnres and .moe)."""
    # a warm start reads no spec (tomllib and the schemas)
    from k3compile.spec import spec_from_table

    return spec_from_table(key.table(), source=f"<k3compile.ops {key.kind}>")


def tuned_records(spec) -> tuple[str | None, dict[str, list[dict]]]:
    """(this GPU's name, the tuning cache's records of the layer on it by tuned entry: chunk,
    chunk_backward; a latent_moe layer's moe, its dispatch table). A record is the layer's whatever spec it was tuned under (`k3c tune` of a
    spec file, k3compile.ops.tuning()): the cache is keyed by what the kernels are a function
    of, not by names. No GPU, or a layer of no tuned entry: (None, {})."""
    gpu = gpu_name() if spec.is_recurrence or spec.kind == "latent_moe" else None
    if gpu is None:
        return None, {}
    cache = TuneCache()
    records = cached_records(spec, None, gpu, cache)
    for message in cache.messages:
        warnings.warn(f"k3compile.ops: {message}", stacklevel=2)
    return gpu, records


def module_stem(key: LayerKey, records: dict[str, list[dict]], options: str = "") -> str:
    """The file name of `key`'s module: its name, and where tuned records are embedded a digest
    of them, so a module compiled before a tune (or a retune) is never reused after it; likewise
    a digest of the pass options it was compiled under."""
    stem = key.module_name()
    if records:
        stem += "_tuned_" + hashlib.sha256(json.dumps(records, sort_keys=True).encode()).hexdigest()[:12]
    if options:
        stem += "_options_" + hashlib.sha256(options.encode()).hexdigest()[:12]
    return stem


def with_hash(source: bytes) -> bytes:
    return HASH_PREFIX + hashlib.sha256(source).hexdigest().encode() + b"\n" + source


def read_cached(path: Path) -> bytes | None:
    """The cached module at `path` (hash line included), or None where it is missing, unreadable
    or fails its hash."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    return data if data == with_hash(data.partition(b"\n")[2]) else None


def compile_layer(spec, path: Path, gpu: str | None, records: dict[str, list[dict]], options: str = "") -> bytes:
    """Compile `spec`'s module, with `records` (tuned on `gpu`, by entry) embedded as `k3c
    compile` embeds them, or under the pass `options` (k3compile.ops.pass_options), and write it
    to `path`; returns what was written."""
    # xDSL, the passes and the printer: a cold start only
    from k3compile import driver

    if records:
        plan = ModulePlan(None)
        compilation = embed_records(spec, plan, gpu, records)
        for message in plan.messages:  # a bucket whose winners this module's kernel code cannot take
            warnings.warn(f"k3compile.ops: {message}", stacklevel=3)
    elif options:
        compilation = driver.lower(spec, pipeline_with(spec.kind, DEFAULT_PIPELINES[spec.kind], options))
    else:
        compilation = driver.lower(spec)
    data = with_hash(compilation.source.encode())
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        driver.write_file_atomic(path, data)
    except OSError as err:
        found = " (the file there is unreadable or fails its hash)" if path.exists() else ""
        raise OutputError(f"{path}: cannot write the compiled k3compile.ops module ({err.strerror}){found}; "
                          "make the folder writable or set K3C_CACHE_DIR to one") from None
    return data


def import_module(path: Path, source: bytes, module_name: str) -> ModuleType:
    """Import a generated module from the bytes checked or written (not the file again: it could
    have changed since, and a stale or damaged __pycache__ is never read). Its functions name
    `path`, which stays: Triton reads the kernels' source there."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    exec(compile(source, str(path), "exec"), module.__dict__)  # noqa: S102 - our own generated module
    return module


def entry_shape(module, entry: str, pattern: str, batch: int, tokens: int, sequences: int) -> list[int]:
    """A shape the module's tables give in the IR's symbols ("NC,32,128,128") at a call's sizes:
    NC = cdiv(B T, C) + N per-chunk slots, C the entry's chunk size (NC_CHUNK_SIZE)."""
    sizes = {"B": batch, "T": tokens, "N": sequences}
    if entry in module.NC_CHUNK_SIZE:
        sizes["NC"] = -(-batch * tokens // module.NC_CHUNK_SIZE[entry]) + sequences
    return [int(d) if d.isdigit() else sizes[d] for d in pattern.split(",")]
