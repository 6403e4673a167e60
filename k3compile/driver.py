"""The compile driver: spec -> k3 IR -> passes -> Triton source -> importable module."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from xdsl.dialects.builtin import ModuleOp

from k3compile.version import __version__
from k3compile.backends.triton.guard_spill_only_stages import GuardSpillOnlyStagesPass
from k3compile.backends.triton.legalize import LegalizeTritonPass
from k3compile.backends.triton.lower import LowerToTritonPass
from k3compile.backends.triton.merge_identical_kernels import MergeIdenticalKernelsPass
from k3compile.backends.triton.printer import print_triton
from k3compile.errors import OutputError, UnsupportedError
from k3compile.files import write_file_atomic
from k3compile.frontend import spec_to_module
from k3compile.passes.outline_kernels import OutlineKernelsPass
from k3compile.pipeline import DEFAULT_PIPELINES, PipelineRun, Verify, run_passes, run_pipeline
from k3compile.spec import LayerSpec, load_spec

# what runs a layer whose kind's pipeline lowers no kernels: its float64 reference, or (a vision
# layer, whose attention is torch's) its torch module
REFERENCE = "k3compile.ir.reference"
RUNS_WITHOUT_KERNELS = {"vision": "k3compile.vision.VisionLayer (torch's attention; docs/vision.md)"}


@dataclass
class Compilation:
    """Everything one compile produced: the IR before and after the passes, and the source."""

    spec: LayerSpec
    pipeline: str
    layer_ir: str
    scheduled: ModuleOp
    source: str
    run: PipelineRun
    timings: list[tuple[str, float]] = field(default_factory=list)


def as_spec(spec: LayerSpec | str | Path) -> LayerSpec:
    return spec if isinstance(spec, LayerSpec) else load_spec(spec)


def schedule(spec: LayerSpec, pipeline: str | None = None, keep_snapshots: bool = False,
             verify: Verify = "each") -> Compilation:
    """Build the IR of a spec and run its pipeline (no code printed yet), verifying the IR after
    every pass, or as `verify` says (k3compile.pipeline)."""
    start = time.perf_counter()
    module = spec_to_module(spec)
    layer_ir = str(module)
    timings = [("build-ir", time.perf_counter() - start)]
    pipeline = DEFAULT_PIPELINES[spec.kind] if pipeline is None else pipeline
    run = run_pipeline(module, pipeline, keep_snapshots=keep_snapshots, verify=verify)
    return Compilation(spec, pipeline, layer_ir, module, "", run, timings + run.timings)


def lower(spec: LayerSpec, pipeline: str | None = None, launch_tables: dict | None = None,
          note: str = "") -> Compilation:
    """Schedule a spec and print its Triton module. launch_tables: entry -> tuned launch configs
    per bucket, embedded in the module (k3compile.runtime.autotune; docs/autotuning.md); note: added
    to the module's docstring.

    The IR is verified once, the module that is printed (after the pipeline and the backend's
    passes); should anything fail on the way, the compile is repeated verifying after every pass
    and raises what that raises (k3compile.pipeline). K3C_VERIFY_EACH=1 verifies after every pass
    from the start."""

    if os.environ.get("K3C_VERIFY_EACH", "").lower() in ("1", "true"):
        compilation = schedule_for_triton(spec, pipeline, verify="each")
    else:
        try:
            compilation = schedule_for_triton(spec, pipeline, verify="off")
            start = time.perf_counter()
            compilation.scheduled.verify()
            compilation.timings.append(("verify", time.perf_counter() - start))
        except Exception:
            schedule_for_triton(spec, pipeline, verify="each")  # raises the error of the pass that failed
            raise
    start = time.perf_counter()
    compilation.source = print_triton(compilation.scheduled, provenance(compilation, note), launch_tables)
    compilation.timings.append(("print-triton", time.perf_counter() - start))
    return compilation


def schedule_for_triton(spec: LayerSpec, pipeline: str | None, verify: Verify) -> Compilation:
    """Schedule a spec and run the Triton backend's passes over its module."""
    compilation = schedule(spec, pipeline, verify=verify)
    if not any(op.name == "k3s.entry" for op in compilation.scheduled.ops):
        layer_op = next(iter(compilation.scheduled.ops)).name
        raise UnsupportedError(
            f"{spec.source}: no kernel lowering for {layer_op} (kind '{spec.kind}') in pipeline "
            f"'{compilation.pipeline}'; `k3c ir` shows its IR and {RUNS_WITHOUT_KERNELS.get(spec.kind, REFERENCE)} runs it"
        )
    # a pipeline that ends before outline-kernels leaves kernels in their entries
    passes = (OutlineKernelsPass(), LegalizeTritonPass(source=spec.source), LowerToTritonPass(),
              GuardSpillOnlyStagesPass(), MergeIdenticalKernelsPass())
    run = run_passes(compilation.scheduled, passes, verify=verify, label="triton:")
    compilation.timings += run.timings
    return compilation


def spec_digest(spec: LayerSpec) -> str:
    """sha256 of what the spec says (name, kind, every parameter with its default filled in)."""
    content = json.dumps({"name": spec.name, "kind": spec.kind, "params": spec.params}, sort_keys=True)
    return hashlib.sha256(content.encode()).hexdigest()


def provenance(compilation: Compilation, note: str = "") -> str:
    """The compiled module's docstring: what it was compiled from, and how to see its IR."""
    spec = compilation.spec
    lines = [f"{spec.name}: compiled {spec.kind} layer (k3compile {__version__}). Needs only torch and triton.", "",
             f"spec: {spec.source} (content sha256 {spec_digest(spec)[:16]})",
             f"layer: {compilation.layer_ir.strip().splitlines()[1].strip()}",
             f"pipeline: {compilation.pipeline}",
             "the schedule IR it was printed from: k3c ir SPEC -p 'PIPELINE' (every block below names its IR op)"]
    return "\n".join(lines + (["", note.strip()] if note else []))


def load_module(path: Path, name: str) -> ModuleType:
    """Import a generated module from its file (the file must stay, Triton reads the source)."""
    module_name = f"k3compiled_{name}_{abs(hash(str(path))):x}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


class CompiledLayer:
    """A compiled layer: its generated module's entries as attributes (`layer.recurrent(...)`)."""

    def __init__(self, compilation: Compilation, path: Path) -> None:
        self.compilation = compilation
        self.spec = compilation.spec
        self.path = path
        self.module = load_module(path, compilation.spec.name)

    @property
    def entries(self) -> list[str]:
        return list(self.module.__all__)

    def __getattr__(self, name: str):
        module = self.__dict__.get("module")
        if module is not None and name in getattr(module, "__all__", ()):
            return getattr(module, name)
        raise AttributeError(f"compiled layer '{self.spec.name}' has no entry '{name}'")


def default_cache_dir() -> Path:
    root = os.environ.get("K3C_CACHE_DIR") or os.path.join("~", ".cache", "k3compile")
    return Path(root).expanduser() / "modules"


def compile(spec: LayerSpec | str | Path, out_dir: str | Path | None = None, pipeline: str | None = None) -> CompiledLayer:
    """Compile a layer spec (path or LayerSpec) and import the result.

    Writes `<out_dir>/<name>.py`, or by default `<name>-<hash of the source>.py` in a per-user
    cache folder (so layers of the same name never overwrite each other), and returns a
    CompiledLayer whose attributes are the module's entries, e.g. `layer.recurrent(q, k, v, g, beta)`.
    Raises SpecError, IRError or UnsupportedError (all K3Error) with a one-line message.
    """
    compilation = lower(as_spec(spec), pipeline)
    if out_dir is None:
        digest = hashlib.sha256(compilation.source.encode()).hexdigest()[:16]
        path = write_module(compilation, default_cache_dir(), f"{compilation.spec.name}-{digest}.py")
    else:
        path = write_module(compilation, Path(out_dir))
    return CompiledLayer(compilation, path)


def write_module(compilation: Compilation, out_dir: str | Path, file_name: str | None = None) -> Path:
    """Write the module as out_dir/<name>.py (or file_name) atomically (write_file_atomic),
    unless the file already holds exactly this source."""
    out_dir = Path(out_dir)
    path = out_dir / (file_name or f"{compilation.spec.name}.py")
    source = compilation.source.encode()
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        # bytes, not text: whatever is there (another encoding, garbage) is simply replaced
        if not (path.is_file() and path.read_bytes() == source):
            write_file_atomic(path, source)
    except OSError as err:
        raise OutputError(f"{out_dir}: cannot write {path.name} there ({err.strerror})") from None
    return path
