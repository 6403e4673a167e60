"""The compiled layers behind k3compile.ops: one generated module per kernel-determining key,
compiled on first use and kept in process (a dict) and on disk.

The key holds what determines the kernels — kind, heads, head dims, state layout, the input
options — and a fingerprint of the compiler's own source, so an edited compiler never reuses a
stale module. Batch size, sequence length, dtype and scale are run-time arguments of the module,
so they never recompile. A module found on disk is imported directly: no xDSL, no passes.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from types import ModuleType

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
    root = os.environ.get("K3C_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "k3compile")
    return Path(root) / "modules" / "ops"


_LOADED: dict[LayerKey, ModuleType] = {}


def layer_module(key: LayerKey) -> ModuleType:
    """The generated module of `key`: from this process, else from the disk cache, else compiled
    (and written there atomically, so processes side by side never see half a file)."""
    module = _LOADED.get(key)
    if module is None:
        name = key.module_name()
        path = cache_dir() / f"{name}.py"
        if not path.exists():
            compile_layer(key, path)
        module = _LOADED[key] = import_module(path, f"k3compile_ops_{name}")
    return module


def compile_layer(key: LayerKey, path: Path) -> None:
    from k3compile import driver
    from k3compile.spec import spec_from_table

    spec = spec_from_table(key.table(), source=f"<k3compile.ops {key.kind}>")
    driver.write_module(driver.lower(spec), path.parent, path.name)


def import_module(path: Path, module_name: str) -> ModuleType:
    """Import a generated module from its file (kept: Triton reads the kernels' source there)."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module
