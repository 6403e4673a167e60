"""On a CUDA GPU: the compiled MoE router (`route` of examples/latent_moe.toml, K3's dims: d 7168,
896 experts, top-16) against the float64 reference on the same bf16 inputs, at R = 1 to 4096
token rows, and the documented tie-break (equal s + bias: the lower expert id first), which
Triton's interpreter cannot tell apart from the other tie-break.

The kernel's logits are fp32 sums of bf16 products in another order than the reference's, so two
experts whose biased scores lie within 1e-4 may come in either order (at the k-th slot: either may
be picked): a row whose ids differ must have picked, slot by slot, scores within 1e-4 of the
reference's, and such near-ties must be rare. Skipped without CUDA; runs in
a fresh process (the CPU tests' conftest turns Triton's interpreter on).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "latent_moe.toml"

SCRIPT = r"""
import json, pathlib, sys
import torch
import k3compile
from k3compile.frontend import spec_to_module
from k3compile.ir import reference
from k3compile.spec import load_spec

example, out, seed = sys.argv[1], pathlib.Path(sys.argv[2]), int(sys.argv[3])
spec = load_spec(example)
layer, op = k3compile.compile(spec, out_dir=out), next(iter(spec_to_module(spec).ops))
E, d, k = op.num_experts.value.data, op.hidden_size.value.data, op.top_k.value.data
gen = torch.Generator(device="cuda").manual_seed(seed)
weight = (torch.randn(E, d, generator=gen, device="cuda") / d**0.5).to(torch.bfloat16)
bias = 0.1 * torch.randn(E, generator=gen, device="cuda")
rows = []
for R in (1, 7, 64, 300, 1000, 4096):  # in every launch by rows of the router's kernels
    x = torch.randn(R, d, generator=gen, device="cuda").to(torch.bfloat16)
    ids, weights = layer.route(x, weight, bias)
    torch.cuda.synchronize()
    want_ids, want_weights = (t.cpu() for t in reference.latent_moe_routing(op, x, weight, bias))
    biased = torch.sigmoid(x.double().cpu() @ weight.double().cpu().T) + bias.double().cpu()
    ranked = biased.sort(dim=-1, descending=True).values[:, :k]
    got_ids = ids.long().cpu()
    exact = (got_ids == want_ids.long()).all(-1)
    close = ((biased.gather(-1, got_ids) - ranked).abs() < 1e-4).all(-1)
    weight_error = ((weights.double().cpu() - want_weights).abs().max(-1).values)[exact]
    rows.append(dict(R=R, exact=int(exact.sum()), wrong=int((~exact & ~close).sum()),
                     weight_error=float(weight_error.max()) if exact.any() else 0.0))
# exact ties: zero rows score sigmoid(0) = 1/2 everywhere; with no bias the first k experts win in order
x = torch.zeros(3, d, device="cuda", dtype=torch.bfloat16)
ids, _ = layer.route(x, weight, torch.zeros(E, device="cuda"))
ties = ids.cpu().tolist() == [list(range(k))] * 3
print(json.dumps(dict(rows=rows, ties=ties)))
"""


def test_route_at_k3_dims_on_cuda(tmp_path, fresh_seed):
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "K3C_POISON_OUTPUTS")}
    env["K3C_POISON_OUTPUTS"] = "1"  # outputs start poisoned: an unwritten element cannot pass
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(EXAMPLE), str(tmp_path), str(fresh_seed)],
                            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    print(json.dumps(report, indent=1))
    assert report["ties"], "equal scores must rank the lower expert id first"
    for row in report["rows"]:
        assert row["wrong"] == 0, row
        assert row["exact"] >= 0.99 * row["R"], row  # near-ties are rare with these draws
        assert row["weight_error"] < 1e-3, row
