"""One vision encoder layer (examples/vision.toml: MoonViT's dims, bf16) on the GPU, one image of
n patches at a time (n = 256 .. 65,536): forward ms and forward + backward ms, the per-layer costs
that drive the bubble simulation (`bench/vision_bubbles_sim.py --layer-costs FILE`) instead of
its analytic FLOPs. Outputs are checked first: at n <= 1,024 against the float64 reference
(ir/vision.py), up to 16,384 against the same layer in fp32, above it against the layer on the
varlen backend (fp32 SDPA takes its math kernel there: n^2 scores). Needs k3compile installed:

    PYTHONPATH=/tmp/site python3 -P bench/vision_layer_gpu.py --out DIR     # on the GPU
    python3 bench/vision_layer_gpu.py --smoke --out DIR                     # CPU, tiny

Writes DIR/vision_layer.md and DIR/vision_layer.json (also printed).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/vision_attention_gpu.py
from vision_attention_gpu import run as timed  # noqa: E402

SIZES = (256, 1024, 4096, 16384, 65536)
REPO = Path(__file__).resolve().parents[1]


def grid_of(patches: int) -> tuple[int, int, int]:
    """A near-square grid of exactly `patches` patches (one frame)."""
    height = max(d for d in range(1, math.isqrt(patches) + 1) if patches % d == 0)
    return (1, height, patches // height)


def main(argv=None) -> int:
    import torch

    from k3compile.frontend import spec_to_module
    from k3compile.ir import vision as reference
    from k3compile.passes.plan_vision_cp import VisionCost
    from k3compile.spec import load_spec, spec_from_table
    from k3compile.vision import BACKENDS, VisionLayer

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--smoke", action="store_true", help="CPU, a tiny layer, fp32 (checks the script)")
    parser.add_argument("--spec", type=Path, default=REPO / "examples" / "vision.toml")
    parser.add_argument("--backend", default="sdpa", choices=BACKENDS)
    parser.add_argument("--sizes", default=None, help="comma-separated patch counts (default 256 .. 65,536)")
    parser.add_argument("--rep", type=int, default=100, help="do_bench's rep (ms)")
    args = parser.parse_args(argv)
    device = "cpu" if args.smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device (use --smoke on a CPU)")
    spec = (spec_from_table(dict(name="tiny_vit", kind="vision", hidden_size=24, num_heads=2, head_dim=8, mlp_dim=40))
            if args.smoke else load_spec(args.spec))
    op = next(iter(spec_to_module(spec).ops))
    dtype = torch.float32 if args.smoke else getattr(torch, spec.params["dtype"])
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else ([16, 60] if args.smoke else list(SIZES))
    torch.manual_seed(0)
    layer = VisionLayer.from_spec(spec, device=device, dtype=dtype)
    wide = VisionLayer.from_spec(spec, device=device, dtype=torch.float32)
    wide.load_state_dict(layer.state_dict())
    cost = VisionCost.from_params(spec.params)
    name = torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu"
    header = (f"{name}, torch {torch.__version__}; one {spec.source} layer ({op.name} @{spec.name}: hidden "
              f"{spec.params['hidden_size']}, {spec.params['num_heads']} x {spec.params['head_dim']} heads, MLP "
              f"{spec.params['mlp_dim']}), {dtype}, attention backend {args.backend}, one image a call")
    print(header)
    records, rows = [], []
    for n in sizes:
        grid = grid_of(n)
        x = torch.randn(n, spec.params["hidden_size"], device=device, dtype=dtype)
        with torch.no_grad():
            got = layer(x, grids=[grid], backend=args.backend).float()
            if n <= 1024:
                weights = {k: v.cpu() for k, v in layer.state_dict().items()}
                want = reference.vision_layer(op, x.cpu(), weights, [grid]).float().to(device)
            elif n <= 16384:
                want = wide(x.float(), grids=[grid])
            else:  # fp32 SDPA falls back to its math kernel on the GPU: n^2 scores (256 GiB at 65,536)
                want = layer(x, grids=[grid], backend="varlen").float()
        error = ((got - want).abs().max() / want.abs().max()).item()
        tolerance = 1e-4 if dtype == torch.float32 else 3e-2
        record = {"patches": n, "grid": grid, "max_rel_error": error}
        if not error <= tolerance:
            record["error"] = f"output off by {error:.3g} of its largest value (> {tolerance})"
        else:
            leaf = x.clone().requires_grad_(True)
            dy = torch.randn_like(x)
            with torch.no_grad():
                forward = timed(lambda: layer(x, grids=[grid], backend=args.backend), device, args.rep)
            both = timed(lambda: layer(leaf, grids=[grid], backend=args.backend).backward(dy), device, args.rep)
            flops = cost.of(n, n)
            record.update(forward_ms=forward, forward_backward_ms=both, forward_tflops=flops / forward * 1e-9,
                          forward_backward_tflops=3 * flops / both * 1e-9)
        records.append(record)
        rows.append(f"| {n:,} | {grid[1]}x{grid[2]} | " + (f"failed: {record['error']} | | | |" if "error" in record else
                    f"{record['forward_ms']:.3f} | {record['forward_tflops']:.1f} | {record['forward_backward_ms']:.3f} | "
                    f"{record['forward_backward_tflops']:.1f} |") + f" {error:.2e} |")
        print(rows[-1], flush=True)
    table = [header, "", "| patches | grid | fwd ms | fwd TFLOP/s | fwd+bwd ms | fwd+bwd TFLOP/s | max rel err |",
             "|---|---|---|---|---|---|---|"] + rows
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "vision_layer.md").write_text("\n".join(table) + "\n")
    (args.out / "vision_layer.json").write_text(json.dumps(
        {"header": header, "layers": spec.params["num_layers"], "records": records}, indent=1))
    print(f"wrote {args.out / 'vision_layer.md'}")
    return 1 if any("error" in r for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
