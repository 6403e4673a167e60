"""Shared fixtures of the k3compile test suite.

Kernels run in Triton's interpreter on the CPU (fp32, small shapes). TRITON_INTERPRET must be
set before triton is imported *and* when a generated module is imported (that is when
`@triton.jit` decides between the interpreter and the GPU compiler), so it is set here first.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton
# generated modules allocate their outputs NaN-filled, so an element a kernel never writes
# cannot pass as a value (read when a generated module is imported)
os.environ["K3C_POISON_OUTPUTS"] = "1"
# the printer checks each kernel's printed code against the IR (a compile skips it: 40% of printing)
os.environ["K3C_PRINTER_CHECKS"] = "1"

import dataclasses  # noqa: E402
import secrets  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from k3compile.checking.interpreter_bounds import install as install_bounds_checks  # noqa: E402
from k3compile.checking.interpreter_bf16 import install as install_bf16_by_value  # noqa: E402

# every kernel the tests launch checks that it loads and stores only inside its tensors, and
# computes on bf16 operands' values, rounding as the GPU does (the interpreter's own ops compute on
# their bits)
install_bounds_checks()
install_bf16_by_value()

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
EXAMPLE_SPECS = sorted(EXAMPLES.glob("*.toml"))
RECURRENCE_KINDS = ("kda", "gated_deltanet", "deltanet", "gla")
GATE_OF_KIND = {"kda": "channel", "gated_deltanet": "scalar", "deltanet": "none", "gla": "channel"}
DELTA_OF_KIND = {"kda": True, "gated_deltanet": True, "deltanet": True, "gla": False}


# --- fresh random inputs, reproducible on failure ------------------------------------------


@pytest.fixture(autouse=True)
def fresh_seed():
    """Every test draws fresh random inputs; the seed is printed so a failure can be replayed
    with K3C_TEST_SEED=<seed>."""
    seed = int(os.environ.get("K3C_TEST_SEED") or secrets.randbits(31))
    torch.manual_seed(seed)
    print(f"K3C_TEST_SEED={seed}")
    yield seed


# --- compiling small layers (cheap) once per parameter set ---------------------------------


class LayerCache:
    """Compiles each distinct (table, pipeline) once per session into its own folder."""

    def __init__(self, factory: pytest.TempPathFactory) -> None:
        self.factory = factory
        self.layers: dict = {}

    def __call__(self, pipeline: str | None = None, **table):
        from k3compile.driver import compile as k3_compile
        from k3compile.spec import spec_from_table

        key = (pipeline, tuple(sorted(table.items())))
        if key not in self.layers:
            spec = spec_from_table(dict(table), source=f"<test {table.get('name')}>")
            out_dir = self.factory.mktemp(f"layer_{table['name']}")
            self.layers[key] = k3_compile(spec, out_dir=out_dir, pipeline=pipeline)
        return self.layers[key]


@pytest.fixture(scope="module")
def own_ops_cache(tmp_path_factory):
    """k3compile.ops' disk cache in a folder of the test module's own, and an in-process cache of
    its own (a module that uses it: `pytestmark = pytest.mark.usefixtures("own_ops_cache")`)."""
    from k3compile.ops import layers

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("K3C_CACHE_DIR", str(tmp_path_factory.mktemp("ops_cache")))
        patch.setattr(layers, "_LOADED", {})
        yield


@pytest.fixture(scope="session")
def compile_layer(tmp_path_factory):
    """compile_layer(pipeline=None, name=..., kind=..., ...) -> CompiledLayer (cached)."""
    return LayerCache(tmp_path_factory)


def layer_op(layer):
    """The k3 op (with verified attributes) of a compiled layer's spec, for the reference."""
    from k3compile.frontend import spec_to_module

    return next(iter(spec_to_module(layer.spec).ops))


def recurrence_table(kind: str, layout: str = "kv", H: int = 2, HV: int | None = None, K: int = 16,
                     V: int = 16, name: str | None = None, **extra) -> dict:
    table = dict(
        name=name or f"{kind}_{layout}_h{H}_hv{HV or H}_k{K}_v{V}",
        kind=kind,
        num_heads=H,
        num_v_heads=HV or H,
        head_k_dim=K,
        head_v_dim=V,
        state_layout=layout,
        dtype="float32",
    )
    table.update(extra)
    return table


# --- inputs of the KDA family (fla layouts) ------------------------------------------------


@dataclasses.dataclass
class RecurrenceShape:
    B: int
    T: int
    H: int
    HV: int
    K: int
    V: int
    seqlens: tuple[int, ...] | None = None

    @property
    def N(self) -> int:
        return len(self.seqlens) if self.seqlens else self.B


def recurrence_inputs(kind: str, layout: str, shape: RecurrenceShape, initial_state: bool = True,
                      dtype=torch.float32) -> dict:
    """Fresh random inputs (never zeros): unit q/k, log-sigmoid decays, beta in (0, 1)."""
    B, T, H, HV, K, V = shape.B, shape.T, shape.H, shape.HV, shape.K, shape.V
    if shape.seqlens is not None:
        assert B == 1 and sum(shape.seqlens) == T
    inputs = {
        "q": F.normalize(torch.randn(B, T, H, K), dim=-1).to(dtype),
        "k": F.normalize(torch.randn(B, T, H, K), dim=-1).to(dtype),
        "v": torch.randn(B, T, HV, V).to(dtype),
    }
    gate = GATE_OF_KIND[kind]
    if gate == "channel":
        inputs["g"] = F.logsigmoid(torch.randn(B, T, HV, K)).clamp(min=-5).to(dtype)
    elif gate == "scalar":
        inputs["g"] = F.logsigmoid(torch.randn(B, T, HV)).clamp(min=-5).to(dtype)
    if DELTA_OF_KIND[kind]:
        inputs["beta"] = torch.sigmoid(torch.randn(B, T, HV)).to(dtype)
    if initial_state:
        state = (shape.N, HV, K, V) if layout == "kv" else (shape.N, HV, V, K)
        inputs["initial_state"] = 0.5 * torch.randn(*state, dtype=torch.float32)
    if shape.seqlens is not None:
        offsets = [0]
        for n in shape.seqlens:
            offsets.append(offsets[-1] + n)
        inputs["cu_seqlens"] = torch.tensor(offsets, dtype=torch.int64)
    return inputs


def as_tensor(matrix) -> torch.Tensor:
    """A sympy matrix of rationals as a float64 tensor."""
    return torch.tensor([[float(matrix[i, j]) for j in range(matrix.cols)] for i in range(matrix.rows)],
                        dtype=torch.float64)


def exact_as_torch(x, gate: str, delta_rule: bool) -> dict:
    """k3compile/checking/exact.py's rational inputs of one head (decays as factors) as float64 tensors in fla's
    layouts, B = H = 1: q, k, v, the log-decay g (None without a gate), beta (None without the
    delta rule) and S0 [K, V]."""
    decays = as_tensor(x.a)
    return {
        **{name: as_tensor(getattr(x, name))[None, :, None, :] for name in ("q", "k", "v")},
        "g": {"channel": torch.log(decays)[None, :, None, :], "scalar": torch.log(decays[:, 0])[None, :, None],
              "none": None}[gate],
        "beta": torch.tensor([float(b) for b in x.beta], dtype=torch.float64)[None, :, None] if delta_rule else None,
        "S0": as_tensor(x.S0),
    }


# --- comparisons ---------------------------------------------------------------------------


def rms_ratio(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.detach().to(torch.float64), ref.detach().to(torch.float64)
    return (out - ref).norm().item() / max(ref.norm().item(), 1e-30)


def assert_rms(out: torch.Tensor, ref: torch.Tensor, what: str, tol: float) -> None:
    """out (kernel) against ref (float64 reference): shape, finiteness and RMS ratio."""
    assert out is not None, f"{what}: kernel returned None"
    assert tuple(out.shape) == tuple(ref.shape), f"{what}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    assert torch.isfinite(out).all(), f"{what}: non-finite values (unwritten NaN-filled elements?)"
    assert torch.isfinite(ref).all(), f"{what}: the reference itself is not finite"
    ratio = rms_ratio(out, ref)
    assert ratio < tol, f"{what}: RMS ratio {ratio:.3e} >= {tol:.0e}"


def assert_matches(out: torch.Tensor, ref: torch.Tensor, what: str, rms_tol: float = 1e-5, atol: float = 1e-5,
                   rtol: float = 1e-5) -> None:
    """out (kernel) against ref (float64 reference): shape, finiteness, RMS ratio and allclose."""
    assert_rms(out, ref, what, rms_tol)
    out64 = out.detach().to(torch.float64)
    err = (out64 - ref).abs().max().item() if ref.numel() else 0.0
    assert torch.allclose(out64, ref, rtol=rtol, atol=atol), f"{what}: max abs error {err:.3e}"


def one_line(message: str) -> bool:
    return "\n" not in message.strip() and message.strip() != ""



def run_cli(capsys, *argv):
    """k3c main(argv) in-process -> (exit code, stdout, stderr)."""
    from k3compile.cli import main

    try:
        code = main([str(a) for a in argv])
    except SystemExit as exit_:  # argparse
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


def bad_input(capsys, *argv) -> str:
    """Run k3c; it must exit 2 with nothing on stdout and one stderr line, which is returned."""
    code, out, err = run_cli(capsys, *argv)
    assert code == 2, f"exit code {code}, stderr {err!r}"
    assert out == "" and "Traceback" not in err
    assert one_line(err), f"expected one stderr line, got {err!r}"
    return err.strip()


def assert_causal(entry, kind: str, layout: str, shape, t0: int) -> None:
    """Changing every input at t >= t0 leaves o[:, :t0] of entry(**inputs) bit-identical."""
    inputs = recurrence_inputs(kind, layout, shape)
    future = recurrence_inputs(kind, layout, shape)
    changed = dict(inputs)
    for name in ("q", "k", "v", "g", "beta"):
        if name in inputs:
            changed[name] = inputs[name].clone()
            changed[name][:, t0:] = future[name][:, t0:]
    o1, _ = entry(**inputs)
    o2, _ = entry(**changed)
    assert torch.isfinite(o1).all() and torch.isfinite(o2).all()
    assert torch.equal(o1[:, :t0], o2[:, :t0]), "outputs before t0 depend on later inputs"
    assert not torch.allclose(o1[:, t0:], o2[:, t0:]), "the change at t >= t0 must show after t0"


MEMBERS_AND_LAYOUTS = [(kind, layout) for kind in RECURRENCE_KINDS for layout in ("kv", "vk")]


def compile_member(kind: str, layout: str, pipeline: str, out_dir, prefix: str):
    """A member at H=2, HV=4, K=24, V=40 (grouped heads, no powers of two) compiled with
    `pipeline`, its outputs poisoned: (compiled layer, its k3.recurrence op)."""
    from k3compile.driver import compile as compile_layer
    from k3compile.frontend import spec_to_module
    from k3compile.spec import spec_from_table

    spec = spec_from_table(recurrence_table(kind, layout, H=2, HV=4, K=24, V=40, name=f"{prefix}_{kind}_{layout}"))
    compiled = compile_layer(spec, out_dir=out_dir, pipeline=pipeline)
    compiled.module.POISON_OUTPUTS = True
    return compiled, next(iter(spec_to_module(spec).ops))


# --- ranks of a gloo group: one process per rank ---------------------------------------------


def run_worker_ranks(worker: Path, world: int, workdir: Path, env: dict, timeout: float = 300) -> list:
    """Run `python worker RANK WORLD WORKDIR` in `world` processes (each joins a gloo group through
    a file in workdir and writes workdir/out<RANK>.pt); every rank must exit 0; per rank, what it
    wrote. A rank that hangs is killed after `timeout` seconds."""
    import subprocess
    import sys

    procs = [subprocess.Popen([sys.executable, str(worker), str(r), str(world), str(workdir)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(world)]
    logs = []
    try:
        for proc in procs:
            logs.append(proc.communicate(timeout=timeout)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for r, (proc, log) in enumerate(zip(procs, logs)):
        assert proc.returncode == 0, f"rank {r} failed:\n{log[-3000:]}"
    return [torch.load(workdir / f"out{r}.pt") for r in range(world)]
