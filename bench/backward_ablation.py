"""Where the time of a backward gradients kernel goes, without hardware counters: time variants of
the generated kernel that leave one stage out, do it another way or read its data from cache, and
take the differences (the method of the device notes; ncu is not on every device machine).

    python3 -P bench/backward_ablation.py --module GEN.py --out DIR [--batch 4 --tokens 4096]

GEN.py is a compiled recurrence module (k3c compile; the edits below find the printed forms of
chunk size 16 and solve block 1). Each variant is the
module's text with the gradients kernel edited, written to DIR/<variant>.py; its Triton compile
runs first in worker processes (all side by side), then each variant's chunk_backward is timed at
the shape with per-kernel times. A variant marked exact must give the base's gradients (within
bf16 rounding of a different summation order); the others compute wrong numbers on purpose and
are only timed. Writes DIR/backward_ablation.md and .json.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import import_file, kernel_times  # noqa: E402


def kernel_text(text: str) -> tuple[int, int]:
    """The span of the gradients kernel's definition in the module's text."""
    start = re.search(r"^def \w+_backward_gradients_kernel\(", text, re.MULTILINE)
    if start is None:
        raise SystemExit("no <layer>_backward_gradients_kernel in the module")
    end = text.index("\n\n\n", start.start())
    return start.start(), end


def half_value_blocks(kernel: str) -> str:
    """Only the first of the value-block loop's iterations (with block_v = V / 2: half the loop)."""
    edited = kernel.replace("tl.static_range(0, (V + BV - 1) // BV)", "tl.static_range(0, 1)")
    if edited == kernel:
        raise SystemExit("no value-block loop in the gradients kernel")
    return edited


def states_from_cache(kernel: str) -> str:
    """S and S_bar read at chunk 0 by every program: the same bytes, from L2, not HBM."""
    edited = re.sub(r"\(\(start // BC \+ i_n\) \* HV \+ i_hv\) \* K \* V", "0", kernel)
    if edited == kernel:
        raise SystemExit("no S / S_bar reloads in the gradients kernel")
    return edited


def no_inverse(kernel: str) -> str:
    """The forward substitution's product chain left out (T = A Diag(beta))."""
    edited, n = re.subn(r"^( +)b_M = _mm_accurate\(b_M, b_M, DOT\)\n\1b_Linv = _mm_accurate\(b_Linv, b_eye \+ b_M, DOT\)\n",
                        "", kernel, flags=re.MULTILINE)
    if not n:
        raise SystemExit("no forward substitution products in the gradients kernel")
    return edited


# name: (edit of the kernel's text, launch num_warps or None, exact: the base's gradients).
# (At db23612 the list also took the back substitution of the forward substitution's adjoint out
# and replaced it by the product with the inverse: bench/results/backward_ablation_h200_076f26a.md;
# derive-backward derives that product since.)
VARIANTS = {
    "base": (None, None, True),
    "warps_4": (None, 4, True),
    "no_inverse_products": (no_inverse, None, False),
    "half_value_blocks": (half_value_blocks, None, False),
    "states_from_cache": (states_from_cache, None, False),
}


def write_variant(module_text: str, name: str, out: Path) -> Path:
    edit, warps, _ = VARIANTS[name]
    start, end = kernel_text(module_text)
    text = module_text[:start] + (edit(module_text[start:end]) if edit else module_text[start:end]) + module_text[end:]
    if warps is not None:  # every launch of the gradients kernel (the plain entry's and the segments')
        text = re.sub(r"(_backward_gradients_kernel\[grid\]\((?:.*\n)*?\s+num_warps=)\d+,",
                      lambda launch: f"{launch[1]}{warps},", text)
    path = out / f"{name}.py"
    path.write_text(text)
    return path


def inputs(B: int, T: int, H: int, dtype=torch.bfloat16, seed: int = 0) -> dict:
    """A channel-gated layer's inputs at K = V = 128 with random cotangents (gates
    logsigmoid(randn), clamped at -5)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    randn = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    x = {n: randn(B, T, H, 128).to(dtype) for n in ("q", "k", "v", "do")}
    x["g"] = torch.nn.functional.logsigmoid(randn(B, T, H, 128)).clamp(min=-5.0)
    x["beta"] = torch.rand(B, T, H, device="cuda", generator=gen).to(dtype)
    x["initial_state"], x["dht"] = 0.1 * randn(B, H, 128, 128), randn(B, H, 128, 128)
    return x


def backward(module, x: dict):
    return module.chunk_backward(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"],
                                 do=x["do"], dht=x["dht"], output_dh0=True)


def warm(path: str, heads: int) -> str:
    module = import_file(Path(path), Path(path).stem)
    backward(module, inputs(1, 64, heads))
    torch.cuda.synchronize()
    return "ok"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=32, help="the module's heads (K = V = 128, HV = H)")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--phase", default="all", choices=("all", "compile", "measure"),
                        help="compile: only the Triton compiles (into the shared cache); measure: only the timings")
    args = parser.parse_args()
    from triton.testing import do_bench

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = Path(args.module).read_text()
    names = args.variants.split(",")
    paths = {name: write_variant(text, name, out) for name in names}
    if args.phase != "measure":
        with ProcessPoolExecutor(args.workers, mp_context=get_context("spawn")) as pool:
            for name, status in zip(names, pool.map(warm, [str(paths[n]) for n in names], [args.heads] * len(names))):
                print(f"compiled {name}: {status}", flush=True)
        if args.phase == "compile":
            return 0
    rows, base = [], None
    for name in names:
        module = import_file(paths[name], name)
        x = inputs(args.batch, args.tokens, args.heads)
        grads = [t.float() for t in backward(module, x)]
        row = {"variant": name, "exact": VARIANTS[name][2], "bwd_ms": do_bench(lambda: backward(module, x), rep=300)}
        row["kernels"] = kernel_times(torch, lambda: backward(module, x), short=lambda n: n.split("backward_")[-1].removesuffix("_kernel"))
        if base is None:
            base = grads
        row["max_rel_diff_vs_base"] = max(((a - b).norm() / b.norm().clamp(min=1e-30)).item() for a, b in zip(grads, base))
        rows.append(row)
        print(json.dumps(row), flush=True)
    base_ms = rows[0]["kernels"].get("gradients", 0.0)
    lines = [f"# Ablation of the backward gradients kernel: {Path(args.module).name} B{args.batch} T{args.tokens}, bf16", "",
             "| variant | exact | gradients ms | minus base | backward ms | largest relative gradient difference vs base |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        ms = row["kernels"].get("gradients", 0.0)
        lines.append(f"| {row['variant']} | {'yes' if row['exact'] else 'no (timing only)'} | {ms:.3f} | {ms - base_ms:+.3f} | "
                     f"{row['bwd_ms']:.3f} | {row['max_rel_diff_vs_base']:.1e} |")
    (out / "backward_ablation.md").write_text("\n".join(lines) + "\n")
    (out / "backward_ablation.json").write_text(json.dumps(rows, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
