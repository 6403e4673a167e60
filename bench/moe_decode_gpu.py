"""LatentMoE decode, both token-centric plans of lower-moe-experts (decode=split, decode=warp),
at 1, 4, 16 and 64 tokens: each plan compiled from the spec into OUT/<plan>/ and timed by
bench/moe_gpu.py's decode table (CUDA graphs, outputs checked against the torch pipeline in
fp32 first, against the weight-bytes floor measured in the same run). An mxfp4 spec times both
plans too, each on the weights packed by its own module: split reads the nibbles layout, warp
the words layout (docs/moe.md); the floor counts the packed bytes.

    python3 bench/moe_decode_gpu.py --spec examples/latent_moe.toml --out DIR   # on the GPU
    python3 bench/moe_decode_gpu.py --spec examples/latent_moe_mxfp4.toml --out DIR
    python3 bench/moe_decode_gpu.py --smoke --out DIR  # CPU: tiny widths, the interpreter

--smoke compiles both plans of a tiny spec, with bf16 expert weights and with MXFP4 ones, and
checks each moe_decode against the float64 reference (MXFP4: on the same codes, dequantised;
no timing).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/common.py, moe_gpu.py
from common import ints  # noqa: E402

PLANS = {"split": "lower-moe-experts{decode=split}", "warp": "lower-moe-experts{decode=warp}"}
SMOKE = dict(name="smoke_moe", kind="latent_moe", hidden_size=64, latent_dim=32, num_experts=16, top_k=4,
             expert_ffn_dim=32, num_shared_experts=1, shared_ffn_dim=16, activation="situ_glu", dtype="float32")


def compile_plan(spec, plan: str, out: Path) -> Path:
    import k3compile

    k3compile.compile(spec, out / plan, pipeline=f"lower-moe-routing,{PLANS[plan]}")
    return next((out / plan).glob("*.py"))


def smoke(out: Path) -> int:
    os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    import k3compile
    from k3compile.frontend import spec_to_module
    from k3compile.ir import reference

    out.mkdir(parents=True, exist_ok=True)
    for weight_format in ("bf16", "mxfp4"):
        table = SMOKE | {"name": f"smoke_moe_{weight_format}", "expert_weight_format": weight_format}
        spec = out / f"{table['name']}.toml"
        spec.write_text("[layer]\n" + "".join(f"{key} = {value!r}\n".replace("'", '"') for key, value in table.items()))
        for plan in PLANS:
            layer = k3compile.compile(spec, out / weight_format / plan, pipeline=f"lower-moe-routing,{PLANS[plan]}")
            op = next(iter(spec_to_module(layer.spec).ops))
            torch.manual_seed(0)
            d, w, E, F, S, Fs = 64, 32, 16, 32, 1, 16
            args = dict(x=torch.randn(3, d), router_weight=torch.randn(E, d) / 8, router_bias=torch.zeros(E),
                        expert_gate_up=torch.randn(E, 2 * F, w) / 6, expert_down=torch.randn(E, w, F) / 6,
                        latent_down=torch.randn(w, d) / 8, latent_up=torch.randn(d, w) / 6,
                        latent_norm_gain=torch.ones(w), shared_gate_up=torch.randn(S, 2 * Fs, d) / 8,
                        shared_down=torch.randn(S, d, Fs) / 4)
            ours = theirs = args
            if weight_format == "mxfp4":  # ours in the module's layout; the reference decodes nibbles
                experts = [args.pop("expert_gate_up"), args.pop("expert_down")]
                ours = args | layer.pack_expert_weights(*experts)
                theirs = args | layer.pack_expert_weights(*experts, layout="nibbles")
            (got,) = layer.moe_decode(**ours)
            want = reference.latent_moe(op, **theirs)
            ratio = float((got.double() - want).norm() / want.norm())
            print(f"{weight_format} {plan}: moe_decode at 3 tokens, RMS ratio to float64 {ratio:.2e}")
            if not ratio < 1e-5:
                return 1
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", default="examples/latent_moe.toml")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokens", type=ints, default=[1, 4, 16, 64])
    parser.add_argument("--plans", default="split,warp")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    if args.smoke:
        return smoke(args.out)
    import moe_gpu

    status = 0
    for plan in args.plans.split(","):
        module = compile_plan(args.spec, plan, args.out)
        print(f"## decode={plan}: {module}")
        status |= moe_gpu.main(["--module", str(module), "--out", str(args.out / plan),
                                "--decode", ",".join(map(str, args.tokens)), "--prefill", ""])
    return status


if __name__ == "__main__":
    raise SystemExit(main())
