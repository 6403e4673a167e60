"""Training (forward + backward) of the chunk entry: k3compile.ops against fla-core, the same call
on both sides, and our gradients against float64 autograd of the reference semantics.

    python3 -P bench/backward_gpu.py --out DIR [--skip-verify] [--skip-bench] [--cases a,b]

(`PHASES=backward OUT=DIR bash bench/device_run.sh` on the device machine.) Needs k3compile (the
layers compile on first use), fla-core 0.6.0 and a GPU.

verify: every member and input form at K = V = 128 (B2 T333, odd, with an initial state and a
final-state cotangent; grouped value heads where the member has them), bf16 and fp16: each
gradient's RMS error ratio against float64 autograd of k3compile.ir.reference (fla's measure,
rms(ours - ref) / rms(ref)) against fla's tolerances (8e-3 dq, dk, dv; 2e-2 dg, dbeta and the
gate parameters; 5e-3 dh0), and fla's own ratio on the same inputs where fla has the call.

bench: forward and forward + backward (torch.autograd.backward of (o, final state) with random
cotangents) of ours and fla's, bf16, q/k L2-normalised in the kernel, initial state and final
state, at the issue's shapes, each under both gate semantics where the member has a gate: bounded
(ours safe_gate=True, lower_bound=-5 on gates clamped at -5 = fla's same call) and unbounded
(g = logsigmoid(randn), both sides' default). Times are do_bench medians; peak memory is
torch.cuda.max_memory_allocated during one forward + backward above what the inputs hold. Rows
of at most 16384 tokens also check both sides' gradients of the first two heads against float64
autograd of the reference on those heads.
Writes DIR/backward_verify.md, DIR/backward_bench.md and DIR/backward.json.

attnres (a case of --cases, run by default): k3compile.ops.attnres.attnres_aggregate's gradients
(bf16, fp16; max RMS ratio over d sources, d query, d gain) against float64 autograd of the
definition, next to torch eager's, and both sides' forward and forward + backward times at K3's width.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

TOLERANCE = {"q": 8e-3, "k": 8e-3, "v": 8e-3, "g": 2e-2, "beta": 2e-2, "A_log": 2e-2, "dt_bias": 2e-2, "h0": 5e-3}
# (case, member, B, T, H, HV, K, V)
BENCH_CASES = [
    ("kda_b4_t4096_h32", "kda", 4, 4096, 32, 32, 128, 128),
    ("kda_b1_t32768_h32", "kda", 1, 32768, 32, 32, 128, 128),
    ("kda_b1_t8192_h96", "kda", 1, 8192, 96, 96, 128, 128),
    ("gdn_b4_t4096_h32", "gdn", 4, 4096, 32, 32, 128, 128),
    ("gla_b4_t4096_h32", "gla", 4, 4096, 32, 32, 128, 128),
]
# (label, member, keyword arguments of both calls beyond the shared ones, HV / H)
VERIFY_FORMS = [
    ("kda", "kda", {}, 1),
    ("kda safe_gate", "kda", {"safe_gate": True, "lower_bound": -5.0}, 1),
    ("kda grouped values", "kda", {}, 2),
    ("kda in-kernel gate, beta logits", "kda", {"use_gate_in_kernel": True, "use_beta_sigmoid_in_kernel": True}, 1),
    ("gdn", "gdn", {}, 1),
    ("gdn grouped values", "gdn", {}, 2),
    ("gla", "gla", {}, 1),
    ("deltanet", "deltanet", {}, 1),
]


def functions(member: str):
    """(ours, fla's) chunk function of a member."""
    import k3compile.ops as ours
    import fla.ops as theirs

    name = {"kda": "kda.chunk_kda", "gdn": "gated_delta_rule.chunk_gated_delta_rule", "gla": "gla.chunk_gla",
            "deltanet": "delta_rule.chunk_delta_rule"}[member]
    pick = lambda package: getattr(getattr(package, name.split(".")[0]), name.split(".")[1])  # noqa: E731
    return pick(ours), pick(theirs)


def make_inputs(member, B, T, H, HV, K, V, dtype, bounded, extra, seed=0):
    """The call's tensors (leaves that require grad) and keyword arguments."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    randn = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    leaves = {"q": randn(B, T, H, K), "k": randn(B, T, H, K), "v": randn(B, T, HV, V)}
    kwargs = {}
    if member in ("kda", "gla"):
        g = F.logsigmoid(randn(B, T, HV, K))
    elif member == "gdn":
        g = F.logsigmoid(randn(B, T, HV))
    if member != "deltanet":
        leaves["g"] = g.clamp(min=-5.0) if bounded else g
    if member in ("kda", "gdn", "deltanet"):
        leaves["beta"] = torch.rand(B, T, HV, device="cuda", generator=gen)
    if extra.get("use_gate_in_kernel"):
        leaves["g"] = randn(*leaves["g"].shape)
        leaves["A_log"] = randn(HV) * 0.5
        leaves["dt_bias"] = randn(HV * K) * 0.5
    if extra.get("use_beta_sigmoid_in_kernel"):
        leaves["beta"] = randn(B, T, HV)
    if member == "gla":  # fla's chunk_gla has no in-kernel l2norm: keys normalised outside
        leaves["k"] = F.normalize(leaves["k"], dim=-1)
        leaves["q"] = F.normalize(leaves["q"], dim=-1)
    else:
        kwargs["use_qk_l2norm_in_kernel"] = True
    state = randn(B, HV, K, V) * 0.1
    tensors = {n: x.to(dtype).requires_grad_() if n not in ("A_log", "dt_bias") else x.requires_grad_()
               for n, x in leaves.items()}
    tensors["initial_state"] = state.requires_grad_()
    cotangents = (randn(B, T, HV, V).to(dtype), randn(B, HV, K, V))
    return tensors, {**kwargs, **extra, "output_final_state": True}, cotangents


def call(function, tensors, kwargs):
    keyword = {**kwargs}
    if "A_log" in tensors:
        keyword.update(A_log=tensors["A_log"], dt_bias=tensors["dt_bias"])
    positional = [tensors[n] for n in ("q", "k", "v", "g", "beta") if n in tensors]
    return function(*positional, initial_state=tensors["initial_state"], **keyword)


def gradients(function, tensors, kwargs, cotangents) -> dict:
    for x in tensors.values():
        x.grad = None
    o, ht = call(function, tensors, kwargs)
    torch.autograd.backward([o, ht], list(cotangents))
    # a copy: .float() of an fp32 gradient (dh0) is the .grad itself, which later backward calls
    # on the same leaves accumulate into
    return {("h0" if n == "initial_state" else n): x.grad.to(torch.float32, copy=True) for n, x in tensors.items()}


def reference_gradients(member, tensors, kwargs, cotangents) -> dict:
    """float64 autograd of the reference semantics of the layer k3compile.ops compiles."""
    from k3compile.frontend import spec_to_module
    from k3compile.ir import reference
    from k3compile.spec import spec_from_table

    H, HV, K, V = tensors["q"].shape[2], tensors["v"].shape[2], tensors["q"].shape[3], tensors["v"].shape[3]
    table = {"name": "ref", "kind": {"gdn": "gated_deltanet"}.get(member, member), "num_heads": H, "num_v_heads": HV,
             "head_k_dim": K, "head_v_dim": V, "qk_l2norm": bool(kwargs.get("use_qk_l2norm_in_kernel"))}
    if kwargs.get("use_gate_in_kernel"):
        table["gate_input"] = "softplus"
    elif kwargs.get("safe_gate"):
        table["gate_input"] = "clamped"
    if kwargs.get("use_beta_sigmoid_in_kernel"):
        table["beta_input"] = "logits"
    op = next(iter(spec_to_module(spec_from_table(table)).ops))
    leaves = {n: x.detach().double().requires_grad_() for n, x in tensors.items()}
    o, ht = reference.recurrence(op, leaves["q"], leaves["k"], leaves["v"], leaves.get("g"), leaves.get("beta"),
                                 initial_state=leaves["initial_state"], output_final_state=True,
                                 A_log=leaves.get("A_log"), dt_bias=leaves.get("dt_bias"))
    loss = (o.to("cuda") * cotangents[0].double()).sum() + (ht.to("cuda") * cotangents[1].double()).sum()
    loss.backward()
    return {("h0" if n == "initial_state" else n): x.grad for n, x in leaves.items()}


def rms_ratio(x, ref) -> float:
    return ((x.double() - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt().clamp_min(1e-30)).item()


def verify(out: Path, results: dict, forms: list[str], with_fla: bool = True) -> bool:
    rows, ok = [], True
    for label, member, extra, group in VERIFY_FORMS:
        if forms and label.replace(" ", "_").replace(",", "") not in forms:  # spaces as _, no commas
            continue
        for dtype in (torch.bfloat16, torch.float16):
            try:
                ours, theirs = functions(member)
                tensors, kwargs, cot = make_inputs(member, 2, 333, 2, 2 * group, 128, 128, dtype,
                                                   bool(extra.get("safe_gate")), extra)
                want = reference_gradients(member, tensors, kwargs, cot)
                got = gradients(ours, tensors, kwargs, cot)
                fla = None
                if with_fla and (group == 1 or member != "gla"):
                    try:
                        fla = gradients(theirs, tensors, kwargs, cot)
                    except Exception as err:  # fla refuses some forms: the row says so
                        fla = repr(err)[:60]
                for name in want:
                    ratio = rms_ratio(got[name], want[name])
                    fla_ratio = "" if not isinstance(fla, dict) else f"{rms_ratio(fla[name], want[name]):.2e}"
                    passed = ratio <= TOLERANCE[name] and torch.isfinite(got[name]).all().item()
                    ok &= passed
                    rows.append((label, str(dtype).split(".")[1], f"d{name}", f"{ratio:.2e}", fla_ratio or str(fla or ""),
                                 f"{TOLERANCE[name]:.0e}", "pass" if passed else "FAIL"))
                    print(rows[-1], flush=True)
            except Exception:
                ok = False
                rows.append((label, str(dtype).split(".")[1], "-", "-", "-", "-", "ERROR " + traceback.format_exc(limit=2)[-200:]))
                print(rows[-1], flush=True)
            text = ["| form | dtype | gradient | ours / ref (RMS ratio) | fla / ref | tolerance | |", "|---|---|---|---|---|---|---|"]
            text += ["| " + " | ".join(r) + " |" for r in rows]
            (out / "backward_verify.md").write_text("\n".join(text) + "\n")  # after every form: a cut run keeps them
    results["verify"] = rows
    return ok


def measure_side(side: str, function, tensors: dict, kwargs: dict, cot, row: dict) -> dict:
    """One side's gradients, peak memory above the inputs, forward and forward + backward times,
    into row under `side`_...; its gradients returned."""
    from triton.testing import do_bench

    def forward():
        with torch.no_grad():
            call(function, tensors, kwargs)

    def training():
        o, ht = call(function, tensors, kwargs)
        torch.autograd.backward([o, ht], list(cot))

    grads = gradients(function, tensors, kwargs, cot)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    training()
    torch.cuda.synchronize()
    row[f"{side}_peak_mb"] = (torch.cuda.max_memory_allocated() - base) / 2**20
    row[f"{side}_fwd_ms"] = do_bench(forward, rep=200)
    row[f"{side}_fwdbwd_ms"] = do_bench(training, grad_to_none=list(tensors.values()), rep=300)
    return grads


def bench(out: Path, results: dict, cases: list[str] | None, disable_recompute: bool = False) -> None:
    rows = []
    for case, member, B, T, H, HV, K, V in BENCH_CASES:
        if cases and case not in cases:
            continue
        for pairing in (("bounded", "unbounded") if member == "kda" else ("unbounded",)):
            bounded = pairing == "bounded"
            extra = {"safe_gate": True, "lower_bound": -5.0} if bounded else {}
            if disable_recompute and member == "kda":  # both sides: fla's switch for the same trade
                extra["disable_recompute"] = True
            row = {"case": case, "gates": pairing + (", disable_recompute" if "disable_recompute" in extra else "")}
            try:
                tensors, kwargs, cot = make_inputs(member, B, T, H, HV, K, V, torch.bfloat16, bounded, extra)
                grads = {}
                # each side on its own: fla refuses some members on some GPUs, ours still stands
                for side, function in zip(("ours", "fla"), functions(member)):
                    try:
                        grads[side] = measure_side(side, function, tensors, kwargs, cot, row)
                    except Exception:
                        row[f"{side}_error"] = traceback.format_exc(limit=-2)[-300:]
                        torch.cuda.synchronize()
                if B * T <= REFERENCE_TOKENS and grads:  # against float64 on two heads (heads are independent)
                    try:
                        kept, kept_cot = two_heads(tensors, cot)
                        want = reference_gradients(member, kept, kwargs, kept_cot)
                        row["grad_rms_vs_float64"] = {side: {n: rms_ratio(head(n, grads[side][n]), want[n])
                                                             for n in want} for side in grads}
                    except Exception:  # the timings stand without it
                        row["float64_error"] = traceback.format_exc(limit=2)[-300:]
                if len(grads) == 2:
                    row["grad_rms_vs_fla_each"] = {n: rms_ratio(grads["ours"][n], grads["fla"][n].double())
                                                   for n in grads["ours"]}
                    row["grad_rms_vs_fla"] = max(row["grad_rms_vs_fla_each"].values())
                    row["ratio"] = row["fla_fwdbwd_ms"] / row["ours_fwdbwd_ms"]
                    row["memory_ratio"] = row["ours_peak_mb"] / row["fla_peak_mb"]
            except Exception:
                row["error"] = traceback.format_exc(limit=3)[-300:]
            rows.append(row)
            print(row, flush=True)
            results["bench"] = rows
            (out / "backward.json").write_text(json.dumps(results, indent=1, default=str))
            (out / "backward_bench.md").write_text(bench_table(rows))  # after every row: a cut run keeps them
    print(bench_table(rows))


def bench_table(rows: list[dict]) -> str:
    text = ["| case | gates | ours fwd ms | ours fwd+bwd ms | fla fwd ms | fla fwd+bwd ms | fla / ours (fwd+bwd) "
            "| ours peak MiB | fla peak MiB | ours / fla memory | max grad RMS ours vs fla "
            "| max grad RMS vs float64, two heads: ours / fla |", "|" + "---|" * 12]

    def cell(r: dict, key: str, form: str) -> str:
        return format(r[key], form) if key in r else "-"

    for r in rows:
        if "error" in r:
            text.append(f"| {r['case']} | {r['gates']} | error: {r['error'].splitlines()[-1]} |" + " |" * 9)
            continue
        failed = " ".join(f"{side} failed: {r[f'{side}_error'].splitlines()[-1]}" for side in ("ours", "fla")
                          if f"{side}_error" in r)
        text.append(f"| {r['case']} | {r['gates']} | {cell(r, 'ours_fwd_ms', '.3f')} | {cell(r, 'ours_fwdbwd_ms', '.3f')} | "
                    f"{cell(r, 'fla_fwd_ms', '.3f')} | {cell(r, 'fla_fwdbwd_ms', '.3f')} | {cell(r, 'ratio', '.2f')} | "
                    f"{cell(r, 'ours_peak_mb', '.0f')} | {cell(r, 'fla_peak_mb', '.0f')} | {cell(r, 'memory_ratio', '.2f')} | "
                    f"{cell(r, 'grad_rms_vs_fla', '.2e')} | {against_float64(r)}{' ' + failed if failed else ''} |")
    return "\n".join(text) + "\n"


REFERENCE_TOKENS = 16384  # the bench rows whose gradients are also checked against float64 (two heads)


def head(name: str, x):
    """The first two heads of a gradient (the head axis: 1 for states, 2 for token tensors)."""
    return x[:, :2] if name == "h0" else x[:, :, :2]


def against_float64(row: dict) -> str:
    """'ours / fla' of the largest RMS ratio against float64, naming the gradient; '-' where not checked."""
    if "grad_rms_vs_float64" not in row:
        return "-"
    checked = row["grad_rms_vs_float64"]
    def worst(side: str) -> str:
        if side not in checked:
            return "-"
        name, ratio = max(checked[side].items(), key=lambda item: item[1])
        return f"d{name} {ratio:.1e}"

    return " / ".join(worst(side) for side in ("ours", "fla"))


def two_heads(tensors: dict, cotangents) -> tuple:
    """(tensors, cotangents) of the first two heads, for the float64 reference."""
    kept = {n: head("h0" if n == "initial_state" else n, x).detach() for n, x in tensors.items()}
    return kept, tuple(head(n, c) for n, c in zip(("o", "h0"), cotangents))


# the AttnRes aggregate at K3's width: (sources, token rows)
ATTNRES_CASES = [(2, 16384), (5, 16384), (9, 16384)]


def attnres_eager(sources, query, gain, eps=1e-6, dtype=torch.float32):
    """The definition in torch: the baseline (fp32 inside), in float64 the gradients' reference."""
    x = sources.to(dtype)
    keys = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gain.to(dtype)
    h = (torch.softmax(keys @ query.to(dtype), dim=0)[..., None] * x).sum(0)
    return h if dtype == torch.float64 else h.to(sources.dtype)


def attnres(out: Path, results: dict) -> bool:
    from triton.testing import do_bench

    from k3compile.ops.attnres import attnres_aggregate

    rows, ok, D = [], True, 7168
    for (S, R), dtype in itertools.product(ATTNRES_CASES, (torch.bfloat16, torch.float16)):
        gen = torch.Generator(device="cuda").manual_seed(S)
        randn = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
        scale = torch.linspace(0.5, 4.0, S, device="cuda")[:, None, None, None]
        tensors = [x.to(dtype).requires_grad_() for x in (randn(S, 1, R, D) * scale, randn(D) * 3 / D ** 0.5,
                                                          1 + 0.3 * randn(D))]
        dout = randn(1, R, D).to(dtype)
        leaves = [x.detach().double().requires_grad_() for x in tensors]
        torch.autograd.backward(attnres_eager(*leaves, dtype=torch.float64), dout.double())
        row = {"case": f"S{S} N{R} D{D}", "dtype": str(dtype).split(".")[1]}
        for side, function in (("ours", attnres_aggregate), ("eager", attnres_eager)):
            training = lambda: torch.autograd.backward(function(*tensors), dout)  # noqa: E731
            for x in tensors:
                x.grad = None
            training()
            row[f"{side}_rms"] = max(rms_ratio(x.grad, w.grad) for x, w in zip(tensors, leaves, strict=True))
            row[f"{side}_fwd_ms"] = do_bench(lambda: function(*(x.detach() for x in tensors)))
            row[f"{side}_fwdbwd_ms"] = do_bench(training, grad_to_none=tensors)
        ok &= row["ours_rms"] <= 8e-3 and row["ours_rms"] <= 2 * row["eager_rms"] + 1e-3
        rows.append(row)
        print(row, flush=True)
    results["attnres"] = rows  # backward.json; a row per case and dtype as it finishes
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--skip-verify", action="store_true")
    parser.add_argument("--skip-bench", action="store_true")
    parser.add_argument("--cases", default="")
    parser.add_argument("--forms", default="", help="verify only these forms (labels with _ for spaces, no commas; comma-separated)")
    parser.add_argument("--no-fla", action="store_true", help="verify ours only (fla's autotuning takes minutes per form)")
    parser.add_argument("--disable-recompute", action="store_true",
                        help="KDA rows with disable_recompute=True on both sides (ours: the saving forward, "
                             "save-forward-values; fla: its own saved intermediates)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    ok = True
    if not args.skip_verify:
        ok = verify(out, results, [f for f in args.forms.split(",") if f], with_fla=not args.no_fla)
    cases = [c for c in args.cases.split(",") if c]
    if not args.skip_bench and (not cases or set(cases) - {"attnres"}):
        bench(out, results, [c for c in cases if c != "attnres"], args.disable_recompute)
    if not args.skip_bench and (not cases or "attnres" in cases):
        ok &= attnres(out, results)
    (out / "backward.json").write_text(json.dumps(results, indent=1, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
