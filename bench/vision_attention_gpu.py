"""The vision encoder's packed-image attention on the GPU: which of torch's kernels to run it on.
Batches of images packed in one sequence (bidirectional attention within each image, a
block-diagonal mask; log-normal sizes 256 .. 65,536 patches, a giant, videos), MoonViT's dims
(16 heads of 72), bf16, forward and forward + backward, by backend (k3compile.vision.attention):

- sdpa: F.scaled_dot_product_attention per image (flash / cuDNN / efficient, no mask), a loop;
- flex: flex_attention (torch.compile'd) with a block mask from the image ids, one call; its mask
  is built per batch (the sizes change each step), timed apart as `mask ms`;
- varlen: torch.nn.attention.varlen.varlen_attn (flash over cu_seqlens), one call.

Outputs and gradients are checked first against SDPA per image in fp32 (the memory-efficient
kernel on fp32 copies of the same inputs); a backend that fails the check or raises is reported,
not timed. Needs k3compile installed (its synthetic batches and backends):

    PYTHONPATH=/tmp/site python3 -P bench/vision_attention_gpu.py --out DIR      # on the GPU
    python3 bench/vision_attention_gpu.py --smoke --out DIR                      # CPU, tiny

Writes DIR/vision_attention.md and DIR/vision_attention.json (also printed).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import warnings
from pathlib import Path


def batches(smoke: bool) -> dict[str, list[str]]:
    from k3compile.vision.batches import synthetic_images

    if smoke:
        return {"tiny mix": ["5x7", "16x16", "3x2x9", "1x1", "12x20"], "one image": ["17x9"]}
    return {
        "log-normal 32": synthetic_images(32, seed=0),
        "log-normal 128": synthetic_images(128, seed=1),
        "many small (256 x ~1k)": synthetic_images(256, seed=2, median=1024, sigma=0.3),
        "giant + 64 small": ["256x256"] + synthetic_images(64, seed=3, median=512, sigma=0.5),
        "videos (3 x 64x32x32) + 16": synthetic_images(16, seed=4) + ["64x32x32"] * 3,
    }


def lengths_of(images) -> list[int]:
    from k3compile.passes.plan_vision_cp import parse_image

    return [parse_image(text).patches for text in images]


def attention_flops(lengths, heads: int, dim: int) -> float:
    return sum(4.0 * n * n * heads * dim for n in lengths)


def reference_attention(q, k, v, lengths, block: int = 512):
    """Attention within each image in the inputs' dtype, a block of query rows at a time under
    torch.utils.checkpoint: memory a block's scores (heads x block x n), not an image's. (SDPA
    on fp32 copies fell back to its math kernel on the H100 and asked for 256 GiB at 65,536
    patches.)"""
    import torch
    from torch.utils.checkpoint import checkpoint

    def rows(qb, kk, vv):
        scores = torch.einsum("qhd,khd->hqk", qb, kk) * qb.shape[-1] ** -0.5
        return torch.einsum("hqk,khd->qhd", scores.softmax(-1), vv)

    outs, start = [], 0
    for n in lengths:
        kk, vv = k[start:start + n], v[start:start + n]
        outs += [checkpoint(rows, q[r:min(r + block, start + n)], kk, vv, use_reentrant=False)
                 for r in range(start, start + n, block)]
        start += n
    return torch.cat(outs)


def run(fn, device: str, rep: int) -> float:
    """Median milliseconds of fn() (CUDA: triton.testing.do_bench; CPU: wall clock)."""
    if device == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=5, rep=rep))
    times = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[1]


def main(argv=None) -> int:
    import torch

    from k3compile.vision import attention as A

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny batches, fp32 (checks the script)")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=72)
    parser.add_argument("--backends", help="comma-separated (default sdpa,flex,varlen; --smoke: sdpa,flex, varlen "
                                           "being CUDA-only)")
    parser.add_argument("--rep", type=int, default=100, help="do_bench's rep (ms)")
    args = parser.parse_args(argv)
    device = "cpu" if args.smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device (use --smoke on a CPU)")
    dtype = torch.float32 if args.smoke else torch.bfloat16
    heads, dim = (2, 8) if args.smoke else (args.heads, args.head_dim)
    backends = [b for b in (args.backends or ("sdpa,flex" if args.smoke else "sdpa,flex,varlen")).split(",") if b]
    if args.smoke:  # flex's unfused CPU path says so once per process
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
    if unknown := sorted(set(backends) - set(A.BACKENDS)):
        parser.error(f"--backends: unknown {unknown}; choose from {', '.join(A.BACKENDS)}")
    name = torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu"
    header = (f"{name}, torch {torch.__version__}, python {platform.python_version()}; heads {heads} x {dim}, "
              f"{dtype}, packed images (one sequence, block-diagonal mask)")
    print(header)
    rows, records = [], []
    for label, images in batches(args.smoke).items():
        lengths = lengths_of(images)
        total = sum(lengths)
        gen = torch.Generator(device=device).manual_seed(0)
        q, k, v, do = (torch.randn(total, heads, dim, device=device, dtype=dtype, generator=gen) for _ in range(4))

        def grads_of(fn, q=q, k=k, v=v, do=do, lengths=lengths):
            leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
            out = fn(*leaves, lengths)
            out.backward(do.to(out.dtype))
            return out.detach(), [t.grad for t in leaves]

        want_o, want_g = grads_of(reference_attention, q.float(), k.float(), v.float(), do.float())
        flops = attention_flops(lengths, heads, dim)
        for backend in backends:
            record = {"batch": label, "images": len(lengths), "patches": total, "largest": max(lengths),
                      "backend": backend}
            try:
                mask_ms = None
                if backend == "flex":
                    mask_ms = run(lambda lengths=lengths: A.image_block_mask(lengths, device), device, args.rep)
                    mask = A.image_block_mask(lengths, device)

                    def call(a, b, c, n, mask=mask):
                        return A.flex_block_mask(a, b, c, n, block_mask=mask)
                else:
                    call = {"sdpa": A.sdpa_per_image, "varlen": A.varlen}[backend]
                backward = not (backend == "flex" and device == "cpu")  # torch has no CPU flex backward
                if backward:
                    got_o, got_g = grads_of(call)
                else:
                    got_o, got_g = call(q, k, v, lengths).detach(), []
                errors = [(got_o.float() - want_o).abs().max().item()] + [
                    (g.float() - w).abs().max().item() for g, w in zip(got_g, want_g)]
                tolerance = 1e-4 if dtype == torch.float32 else 3e-2
                if not all(e <= tolerance for e in errors):
                    raise AssertionError(f"max errors {['%.3g' % e for e in errors]} > {tolerance} (fp32 reference)")
                forward_ms = run(lambda: call(q, k, v, lengths), device, args.rep)
                leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
                both_ms = run(lambda: call(*leaves, lengths).backward(do), device, args.rep) if backward else None
                record.update(forward_ms=forward_ms, forward_backward_ms=both_ms, mask_ms=mask_ms,
                              max_error=max(errors), forward_tflops=flops / forward_ms * 1e-9,
                              forward_backward_tflops=(3.5 * flops / both_ms * 1e-9) if both_ms else None)
            except Exception as err:  # reported in the table, the other backends still run
                record["error"] = f"{type(err).__name__}: {err}".replace("\n", " ").replace("|", "/")[:200]
            records.append(record)
            rows.append(row(record))
            print(rows[-1], flush=True)
    table = [header, "", "TFLOP/s count the attention's matmuls (4 n^2 H D a forward, 3.5x that with the backward: "
                         "the flash backward recomputes QK^T).", "",
             "| batch | images | patches | largest | backend | fwd ms | fwd TFLOP/s | fwd+bwd ms | fwd+bwd TFLOP/s "
             "| mask ms | max err vs fp32 |", "|---|---|---|---|---|---|---|---|---|---|---|"] + rows
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "vision_attention.md").write_text("\n".join(table) + "\n")
    (args.out / "vision_attention.json").write_text(json.dumps({"header": header, "records": records}, indent=1))
    print(f"wrote {args.out / 'vision_attention.md'}")
    return 0


def row(r: dict) -> str:
    def f(value, spec=".3f"):
        return "-" if value is None else format(value, spec)

    if "error" in r:
        return (f"| {r['batch']} | {r['images']} | {r['patches']:,} | {r['largest']:,} | {r['backend']} | "
                f"failed: {r['error']} | | | | | |")
    return (f"| {r['batch']} | {r['images']} | {r['patches']:,} | {r['largest']:,} | {r['backend']} | "
            f"{f(r['forward_ms'])} | {f(r['forward_tflops'], '.1f')} | {f(r['forward_backward_ms'])} | "
            f"{f(r['forward_backward_tflops'], '.1f')} | {f(r['mask_ms'])} | {r['max_error']:.2e} |")


if __name__ == "__main__":
    sys.exit(main())
