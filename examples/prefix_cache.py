"""Prefix caching for a KDA layer: insert one prompt, resume a second one from a hit.

    python examples/prefix_cache.py                  # CPU: Triton's interpreter, small dims (~10 s)
    python examples/prefix_cache.py --block-tokens 512 --heads 32 --dim 128   # on a GPU

1. Prompt A is prefilled with `chunk(..., checkpoint_every=block_tokens)` and inserted into a
   `PrefixCache` with its attention page ids (here from a toy allocator); the policy keeps the
   state every 2 blocks and at the end of the prompt.
2. Prompt B shares A's first 3.5 blocks: the lookup matches 3 blocks (the partial 4th never
   matches), resumes from A's checkpoint at 2 blocks and recomputes 1 block.
3. B runs from the checkpoint (`initial_state=hit.state`) and is inserted with its own
   checkpoints while the hit is held (B again would resume from its end); its outputs and final
   state are compared with a full prefill of B.
Random projections stand in for the model's q, k, v, gate and beta; a causal model gives the
tokens the two prompts share the same ones.
"""

from __future__ import annotations

import argparse
import os


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--block-tokens", type=int, default=64)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--dim", type=int, default=32)
    args = parser.parse_args()

    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (by the compiled module)
    import torch.nn.functional as F

    import k3compile
    from k3compile.runtime.serving import CheckpointPolicy, PrefixCache, split_checkpoints
    from k3compile.spec import spec_from_table

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32  # the interpreter computes in fp32
    BT, H, D = args.block_tokens, args.heads, args.dim
    spec = spec_from_table(dict(name="kda_prefix_demo", kind="kda", num_heads=H, head_k_dim=D, head_v_dim=D,
                                dtype=str(dtype).removeprefix("torch.")))
    layer = k3compile.compile(spec)

    def projections(T):
        """Stand-ins for the layer's projections of T tokens."""
        return dict(q=F.normalize(torch.randn(1, T, H, D, device=device), dim=-1).to(dtype),
                    k=F.normalize(torch.randn(1, T, H, D, device=device), dim=-1).to(dtype),
                    v=torch.randn(1, T, H, D, device=device).to(dtype),
                    g=F.logsigmoid(torch.randn(1, T, H, D, device=device)).clamp(min=-5).to(dtype),
                    beta=torch.sigmoid(torch.randn(1, T, H, device=device)).to(dtype))

    cache = PrefixCache(block_tokens=BT, policy=CheckpointPolicy(every_blocks=2))
    next_page = iter(range(1_000_000))  # the engine's KV allocator: one page per block here

    # 1. prefill prompt A and insert it
    tokens_a = torch.randint(0, 50_000, (4 * BT + 20,)).tolist()
    inputs_a = projections(len(tokens_a))
    _, _, kept = layer.chunk(**inputs_a, output_final_state=True, checkpoint_every=BT)
    (checkpoints,) = split_checkpoints(kept, BT)
    inserted = cache.insert(tokens_a, checkpoints, pages=[next(next_page) for _ in range(len(tokens_a) // BT)])
    print(f"inserted A ({len(tokens_a)} tokens): {inserted.new_blocks} blocks, checkpoints at "
          f"{list(inserted.checkpoint_positions)}")

    # 2. prompt B shares 3.5 blocks of A
    shared = 3 * BT + BT // 2
    tokens_b = tokens_a[:shared] + torch.randint(0, 50_000, (2 * BT,)).tolist()
    fresh = projections(len(tokens_b) - shared)
    inputs_b = {name: torch.cat([inputs_a[name][:, :shared], fresh[name]], dim=1) for name in fresh}

    # 3. resume B from the hit (keep one token to compute: look up all but the last)
    with cache.lookup(tokens_b[:-1]) as hit:
        print(f"B ({len(tokens_b)} tokens): matched_tokens {hit.matched_tokens}, state_tokens {hit.state_tokens}, "
              f"recompute_tokens {hit.recompute_tokens}, attention pages reused {list(hit.pages)}")
        start = hit.state_tokens
        o, final, kept = layer.chunk(**{name: x[:, start:] for name, x in inputs_b.items()},
                                     initial_state=hit.state[None], output_final_state=True, checkpoint_every=BT)
        # insert B while the hit pins its blocks: the hit's pages for what it matched, new ones
        # for the rest (released first, the hit's blocks could be evicted and their pages freed)
        pages = [*hit.pages, *(next(next_page) for _ in range(len(tokens_b) // BT - len(hit.pages)))]
        (checkpoints,) = split_checkpoints(kept, BT, start=start)
        inserted = cache.insert(tokens_b, checkpoints, pages=pages)
        matched = hit.matched_tokens
    print(f"inserted B: {inserted.new_blocks} new blocks, checkpoints at {list(inserted.checkpoint_positions)}")

    full_o, full_final = layer.chunk(**inputs_b, output_final_state=True)
    error_o = (o[:, matched - start:].float() - full_o[:, matched:].float()).abs().max().item()
    error_state = (final - full_final).abs().max().item()
    print(f"max |error| vs a full prefill of B: outputs after matched_tokens {error_o:.2e}, final state "
          f"{error_state:.2e}")
    print(cache.stats())


if __name__ == "__main__":
    main()
