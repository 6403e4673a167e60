"""The compiled MoE router (`route` of a latent_moe module) on the GPU against torch eager doing
the same routing (bf16 GEMM, sigmoid, top-k of s + bias, unbiased weights normalised and scaled),
at R token rows; each row's bytes floor is the router weight and x read once and the ids and
weights written, over the copy bandwidth measured in the same run. Needs only torch and triton:

    python -c "import k3compile; k3compile.compile('examples/latent_moe.toml', 'bench/generated/moe')"
    python3 bench/moe_route_gpu.py --module bench/generated/moe/latent_moe.py --out DIR   # on the GPU

Writes DIR/moe_route.md (also printed).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/common.py
from common import import_file  # noqa: E402

ROWS = (1, 16, 64, 256, 2048, 8192)


def main(argv=None) -> int:
    import torch
    import triton
    import triton.testing

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--module", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    module = import_file(args.module, "moe_route_module")
    layer = dict(item.split(" = ", 1) for item in next(
        line for line in module.__doc__.splitlines() if line.startswith("layer: ")).split("<", 1)[1].rstrip(">").split(", "))
    E, d, k = int(layer["num_experts"]), int(layer["hidden_size"]), int(layer["top_k"])
    scale, normalize = float(layer["routed_scaling_factor"]), layer["norm_topk_prob"] == "true"

    gen = torch.Generator(device="cuda").manual_seed(0)
    weight = (torch.randn(E, d, generator=gen, device="cuda") / d**0.5).to(torch.bfloat16)
    bias = 0.1 * torch.randn(E, generator=gen, device="cuda")

    def torch_route(x, precise=False):
        # eager as a model would run it (a bf16 GEMM, its output rounded to bf16); precise: fp32
        # products of the same bf16 values, to check ours against
        s = torch.sigmoid(x.float() @ weight.float().T if precise else (x @ weight.T).float())
        ids = torch.topk(s + bias, k, dim=-1).indices
        w = s.gather(-1, ids)
        if normalize:
            w = w / w.sum(-1, keepdim=True)
        return ids.int(), w * scale

    scratch = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    copy_s = triton.testing.do_bench(lambda: scratch.clone()) * 1e-3
    copy_Bps = 2 * scratch.numel() / copy_s
    lines = [f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; "
             f"E {E}, d {d}, top-{k}, bf16 x and router weight, fp32 bias; copy bandwidth {copy_Bps / 1e12:.2f} TB/s",
             "", "| R rows | ours µs | torch eager µs | torch / ours | floor µs | ours of floor | rows with the fp32 router's ids |",
             "|---|---|---|---|---|---|---|"]
    for R in ROWS:
        x = torch.randn(R, d, generator=gen, device="cuda").to(torch.bfloat16)
        ours_ids, _ = module.route(x, weight, bias)
        # rows whose ids equal the fp32 router's (near-ties may differ in order: reported, not asserted)
        same = int((ours_ids == torch_route(x, precise=True)[0]).all(-1).sum())
        ours = triton.testing.do_bench(lambda x=x: module.route(x, weight, bias)) * 1e3
        eager = triton.testing.do_bench(lambda x=x: torch_route(x)) * 1e3
        floor = (weight.numel() * 2 + x.numel() * 2 + R * k * 8) / copy_Bps * 1e6
        lines.append(f"| {R} | {ours:.1f} | {eager:.1f} | {eager / ours:.2f} | {floor:.1f} | {floor / ours:.0%} | {same} of {R} |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "moe_route.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
