"""Steep gates on the GPU: log-decays of -3e4, -1e9 and -inf (a reset), and an in-kernel softplus
gate with exp(A_log) ~ 1e13 on one head, through each gated member's compiled `chunk` (forward)
and its autograd (the plain `chunk` under torch.autograd: chunk_backward), bf16 and fp16, against
the float64 token recurrence (k3compile.ir.reference) and its autograd, at fla's tolerances
(RMS ratio 5e-3 for o and the final state, k3compile.checking.verify_backward's per gradient).

    python3 bench/steep_gates_gpu.py --out DIR      # on the GPU; writes DIR/steep_gates.md
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/common.py, also under `python -P`
from common import git_commit  # noqa: E402

B, T, H, HV, K, V = 2, 1000, 2, 4, 128, 128  # T: 62 chunks of 16 and a partial one
STEEP_TOKENS = {5: -3e4, 16: -1e9, 31: float("-inf"), 35: -1e9, 36: -1e9, 500: float("-inf"), 999: -3e4}  # those < T
OUTPUT_TOLERANCE = 5e-3  # fla's for o and the final state in half precision
DEVICE = "cuda"
CASES = [("kda", "log"), ("kda", "softplus"), ("gated_deltanet", "log"), ("gated_deltanet", "softplus"),
         ("gla", "log")]


def rms_ratio(out, ref) -> float:
    out, ref = out.detach().double().cpu(), ref.detach().double().cpu()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def compile_layer(kind: str, form: str, dtype: str, out_dir: Path):
    from k3compile.driver import compile as k3_compile
    from k3compile.spec import spec_from_table

    table = dict(name=f"steep_{kind}_{form}_{dtype}", kind=kind, num_heads=H, num_v_heads=HV, head_k_dim=K,
                 head_v_dim=V, dtype=dtype, gate_input=form)
    return k3_compile(spec_from_table(table, source="<steep_gates_gpu>"), out_dir=out_dir)


def draw(kind: str, form: str, dtype: torch.dtype, gen: torch.Generator) -> dict:
    """Inputs in the compiled layer's dtype (g, A_log, dt_bias and the state fp32), on the GPU."""
    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    channel = kind != "gated_deltanet"
    x = {"q": F.normalize(randn(B, T, H, K), dim=-1).to(dtype), "k": F.normalize(randn(B, T, H, K), dim=-1).to(dtype),
         "v": randn(B, T, HV, V).to(dtype), "initial_state": 0.5 * randn(B, HV, K, V)}
    shape = (B, T, HV, K) if channel else (B, T, HV)
    if form == "log":
        g = F.logsigmoid(randn(*shape))
        for t, value in ((t, v) for t, v in STEEP_TOKENS.items() if t < T):  # half the channels of every head at each listed token
            if channel:
                g[:, t][torch.rand(B, HV, K, generator=gen) < 0.5] = value
            else:
                g[:, t] = value
    else:  # value head 1 decays by exp(-exp(30) softplus(.)): every token a reset
        g = randn(*shape)
        x["A_log"] = torch.tensor([-0.5, 30.0, -0.3, 0.1])
        x["dt_bias"] = 0.5 * randn(HV * K if channel else HV)
    x["g"] = g
    if kind != "gla":
        x["beta"] = torch.sigmoid(randn(B, T, HV)).to(dtype)
    return {n: t.to(DEVICE) for n, t in x.items()}


def check(layer, kind: str, form: str, dtype: torch.dtype, gen: torch.Generator) -> dict:
    from k3compile.frontend import spec_to_module
    from k3compile.checking.verify_backward import gradient_tolerance, reference_gradients

    op = next(iter(spec_to_module(layer.spec).ops))
    x = draw(kind, form, dtype, gen)
    do = torch.randn(B, T, HV, V, generator=gen).to(DEVICE, dtype)
    dht = torch.randn(B, HV, K, V, generator=gen).to(DEVICE)
    leaves = {n: t.clone().requires_grad_() for n, t in x.items()}
    o, final = layer.module.chunk(**leaves, output_final_state=True)
    torch.autograd.backward([o, final], [do, dht])
    from k3compile.ir import reference

    ref_o, ref_final = reference.recurrence(op, **x, output_final_state=True)
    want = reference_gradients(op, x, do, dht)
    row = {"o": rms_ratio(o, ref_o), "final": rms_ratio(final, ref_final), "finite": bool(torch.isfinite(o).all())}
    worst, ok = ("", 0.0), row["o"] < OUTPUT_TOLERANCE and row["final"] < OUTPUT_TOLERANCE and row["finite"]
    for name, leaf in leaves.items():
        key = "h0" if name == "initial_state" else name
        ratio = rms_ratio(leaf.grad, want[key])
        ok &= ratio < gradient_tolerance(f"d{key}", dtype) and bool(torch.isfinite(leaf.grad).all())
        worst = max(worst, (f"d{key}", ratio), key=lambda p: p[1])
    row.update(worst=worst, passed=ok)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cases", default=",".join(f"{k}:{f}" for k, f in CASES),
                        help="member:gate pairs, comma-separated (default all; processes in parallel compile faster)")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (Triton's interpreter): "
                        "runs the script, its half-precision figures mean nothing there")
    args = parser.parse_args()
    if args.smoke:
        global T, K, V, DEVICE
        T, K, V, DEVICE = 40, 16, 16, "cpu"
    args.out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    device = torch.cuda.get_device_name() if DEVICE == "cuda" else "the CPU (--smoke)"
    lines = [f"# Steep gates on {device}, k3compile {git_commit()}, torch {torch.__version__}",
             "", f"B{B} T{T} H{H} HV{HV} K{K} V{V}; log gates: half the channels at tokens "
             f"{', '.join(f'{t} ({v:g})' for t, v in STEEP_TOKENS.items())}; softplus: A_log = 30 on value head 1.",
             "RMS ratios against the float64 token recurrence and its autograd (plain `chunk` under torch.autograd).",
             "", "| member | gate | dtype | o | final state | worst gradient | passed |", "|---|---|---|---|---|---|---|"]
    failed = 0
    with tempfile.TemporaryDirectory() as out_dir:
        cases = [tuple(case.split(":")) for case in args.cases.split(",")]
        for (kind, form), dtype in ((c, d) for c in cases for d in (torch.bfloat16, torch.float16)):
            name = str(dtype).removeprefix("torch.")
            layer = compile_layer(kind, form, name, Path(out_dir))
            row = check(layer, kind, form, dtype, gen)
            failed += not row["passed"]
            lines.append(f"| {kind} | {form} | {name} | {row['o']:.2e} | {row['final']:.2e} | "
                         f"{row['worst'][0]} {row['worst'][1]:.2e} | {'yes' if row['passed'] else 'NO'} |")
            print(lines[-1], flush=True)
    lines += ["", f"{len(cases) * 2 - failed} passed, {failed} failed"]
    (args.out / f"steep_gates{'' if len(cases) == len(CASES) else '_' + args.cases.replace(':', '_').replace(',', '-')}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
