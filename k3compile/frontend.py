"""Spec -> `k3` IR: one op per layer, attributes taken from the validated spec."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import sys
from pathlib import Path

import xdsl
from xdsl.dialects.builtin import ModuleOp
from xdsl.utils.exceptions import VerifyException

from k3compile.errors import SpecError
from k3compile.files import write_file_atomic
from k3compile.ir.k3 import AttnResOp, LatentMoEOp, RecurrenceOp, VisionOp
from k3compile.passes.common import props
from k3compile.pipeline import DEFAULT_PIPELINES, SPECULATIVE_PIPELINE, run_pipeline
from k3compile.spec import REQUIRED, RECURRENCE_KINDS, SCHEMAS, LayerSpec, spec_from_table

# the layer module_symbols compiles: a name no pass gives a symbol (kernels are <layer>_<what>)
PROBE_NAME = "k3c_symbol_probe"


def spec_to_module(spec: LayerSpec) -> ModuleOp:
    """The layer's k3 IR; SpecError if the spec describes an impossible layer or its name is
    one its module's symbols take."""
    if clash := name_clash(spec.name, spec.kind):
        fixed = ", ".join(sorted(module_symbols(spec.kind)[0]))
        raise SpecError(f"{spec.source}: [layer]: key 'name': {spec.name!r} would define {clash!r} twice in the "
                        f"compiled module (every {spec.kind} module defines {fixed}, whatever its layer's name); "
                        "choose another name")
    return layer_module(spec)


def layer_module(spec: LayerSpec) -> ModuleOp:
    params = dict(spec.params)
    if spec.kind in RECURRENCE_KINDS:
        op_type = RecurrenceOp
        params.update(RECURRENCE_KINDS[spec.kind])
    else:
        op_type = {"attnres": AttnResOp, "latent_moe": LatentMoEOp, "vision": VisionOp}[spec.kind]
    params["sym_name"] = spec.name
    # in the op's declaration order, so printed IR reads the same for every spec
    order = op_type.get_irdl_definition().properties
    defaults = getattr(op_type, "INPUT_DEFAULTS", {})  # optional properties: left out at their defaults
    properties = props(op_type, **{key: params[key] for key in order
                                   if key not in defaults or params[key] != defaults[key]})
    op = op_type.create(properties=properties)
    module = ModuleOp([op])
    try:
        module.verify()
    except VerifyException as err:
        raise SpecError(f"{spec.source}: {err}") from None
    return module


def name_clash(name: str, kind: str) -> str | None:
    """The symbol of a compiled `kind` module that a layer called `name` would define twice, or None."""
    fixed, suffixes = module_symbols(kind)
    if name in fixed:
        return name
    return next((f"{name}_{suffix}" for suffix in suffixes if f"{name}_{suffix}" in fixed), None)


@functools.cache
def module_symbols(kind: str) -> tuple[frozenset[str], frozenset[str]]:
    """(the symbols every compiled `kind` module defines whatever its layer's name: its entries
    and those passes make on the way; the suffixes of those named after the layer: its kernels),
    from probe_symbols, once per kind and version of k3compile's source: kept in the k3compile
    cache folder (symbols_cache_path). Running the probe's pipelines costs as much as the
    compile's own (~95 ms of a ~430 ms compile of examples/kda.toml); reading it back ~1 ms."""
    try:
        path = symbols_cache_path(kind)
    except (OSError, TypeError, AttributeError, IndexError):  # sources not in folders (a zip): no cache
        return probe_symbols(kind)
    try:
        cached = json.loads(path.read_text())
        if (isinstance(cached, dict) and set(cached) == {"fixed", "suffixes"}
                and all(isinstance(names, list) and all(isinstance(n, str) for n in names) for names in cached.values())):
            return frozenset(cached["fixed"]), frozenset(cached["suffixes"])
    except (OSError, ValueError):  # none yet, unreadable, or not JSON: probe again (and replace it)
        pass
    fixed, suffixes = probe_symbols(kind)
    try:  # a cache the user cannot write to only costs time
        path.parent.mkdir(parents=True, exist_ok=True)
        write_file_atomic(path, json.dumps({"fixed": sorted(fixed), "suffixes": sorted(suffixes)}).encode())
        for stale in path.parent.glob(f"{kind}-*.json"):  # those of other source versions
            if stale != path:
                stale.unlink(missing_ok=True)
    except OSError:
        pass
    return fixed, suffixes


def symbols_cache_path(kind: str) -> Path:
    """<cache folder>/symbols/<kind>-<digest>.json: the folder of driver.default_cache_dir
    ($K3C_CACHE_DIR, else ~/.cache/k3compile); the digest of what the probe's answer depends on,
    the kind and the source of k3compile, its IR, passes and backends (source_digest), and the
    xDSL and Python versions."""
    root = Path(os.environ.get("K3C_CACHE_DIR") or os.path.join("~", ".cache", "k3compile")).expanduser()
    packages = ("k3compile", "k3compile.ir", "k3compile.passes", "k3compile.backends")
    roots = [Path(importlib.util.find_spec(name).submodule_search_locations[0]) for name in packages]
    key = f"{kind}\0{xdsl.__version__}\0{sys.version_info[:2]}\0{source_digest(roots)}"
    return root / "symbols" / f"{kind}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def source_digest(roots: list[Path]) -> str:
    """sha256 of every .py file under the folders (their paths in them and their bytes): ~4 ms."""
    digest = hashlib.sha256()
    for index, root in enumerate(roots):
        for path in sorted(root.rglob("*.py")):
            digest.update(f"{index}/{path.relative_to(root).as_posix()}\0".encode())
            digest.update(path.read_bytes())
            digest.update(b"\0")
    return digest.hexdigest()


def probe_symbols(kind: str) -> tuple[frozenset[str], frozenset[str]]:
    """module_symbols' answer, found after each pass of the kind's pipelines over a small layer
    (the symbols do not depend on its dimensions)."""
    table = {key: 2 for key, rule in SCHEMAS[kind].items() if rule.default is REQUIRED}  # dimensions and counts
    probe = spec_from_table({"name": PROBE_NAME, "kind": kind, **table})
    pipelines = [DEFAULT_PIPELINES[kind]] + ([SPECULATIVE_PIPELINE] if kind in RECURRENCE_KINDS else [])
    symbols = set()

    def collect(_pass: str, module: ModuleOp) -> None:
        symbols.update(op.properties["sym_name"].data for op in module.ops)

    for pipeline in pipelines:
        # unverified: only the names are read off the probe (the compile this check guards verifies its own IR)
        run_pipeline(layer_module(probe), pipeline, verify="off", observe=collect)
    named_after = {symbol for symbol in symbols if symbol.startswith(f"{PROBE_NAME}_")}
    return (frozenset(symbols - named_after - {PROBE_NAME}),
            frozenset(symbol.removeprefix(f"{PROBE_NAME}_") for symbol in named_after))
