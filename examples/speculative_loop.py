"""A draft / verify / accept loop with k3compile's replay kernels (no state snapshots).

    python examples/speculative_loop.py            # CPU: Triton's interpreter, small dims
    python examples/speculative_loop.py --device cuda --heads 32 --dim 128 --batch 64

Each round, for every sequence of a continuous batch:
1. the draft model proposes up to n tokens (here: random projections stand in for them);
2. one `spec_step` launch commits the previous round's accepted tokens into the pool (a replay
   from the committed state and the cache that round wrote: one state write, whatever n is),
   then runs the target's KDA layer over the new tokens from that state and caches, per token,
   k, the log-decay and the update u into the other cache of the pair;
3. the sampler accepts a prefix of m tokens (here: random m per sequence, 0..n); the next
   `spec_step` commits them, and the two caches swap roles.
After the last round `commit` flushes the last accepted tokens, and the pool is compared with
the plain recurrence run over the accepted tokens only.
"""

from __future__ import annotations

import argparse
import os


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--batch", type=int, default=3)
    parser.add_argument("--drafts", type=int, default=4, help="tokens verified per round (bonus + drafts)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"

    import torch
    import torch.nn.functional as F

    import k3compile
    from k3compile.spec import spec_from_table

    H, D, B, n = args.heads, args.dim, args.batch, args.drafts
    spec = spec_from_table(dict(name="kda_spec_demo", kind="kda", num_heads=H, head_k_dim=D, head_v_dim=D,
                                dtype="float32" if args.device == "cpu" else "bfloat16"))
    layer = k3compile.compile(spec, pipeline=f"derive-replay{{draft-tokens={n}}},lower-speculative,lower-recurrent")
    dtype = torch.float32 if args.device == "cpu" else torch.bfloat16
    dev = args.device

    pool_size = 2 * B  # a state pool shared by the serving engine; each sequence owns one slot
    pool = 0.1 * torch.randn(pool_size, H, D, D, device=dev)
    # two caches [P, n, HV, 2K + V] fp32: spec_step reads one (the last round's) and writes the other
    cache, next_cache = torch.empty(2, pool_size, n, H, 2 * D + D, device=dev)
    slots = torch.randperm(pool_size, device=dev)[:B]
    start = pool[slots].clone()
    accepted = torch.zeros(B, dtype=torch.int64, device=dev)  # first round: nothing to commit
    accepted_tokens = {name: [] for name in ("q", "k", "v", "g", "beta")}

    for round_ in range(args.rounds):
        # 1. the draft's n tokens, projected by the target layer's q/k/v/gate/beta projections
        q = F.normalize(torch.randn(B, n, H, D, device=dev), dim=-1).to(dtype)
        k = F.normalize(torch.randn(B, n, H, D, device=dev), dim=-1).to(dtype)
        v = torch.randn(B, n, H, D, device=dev).to(dtype)
        g = F.logsigmoid(torch.randn(B, n, H, D, device=dev)).clamp(min=-5)
        beta = torch.sigmoid(torch.randn(B, n, H, device=dev)).to(dtype)
        # 2. commit last round's `accepted`, verify this round: outputs for every drafted position
        (o,) = layer.spec_step(q, k, v, g, beta, state=pool, state_indices=slots, cache=cache, accepted=accepted,
                               next_cache=next_cache)
        cache, next_cache = next_cache, cache
        # 3. accept a prefix per sequence (a real sampler compares o's logits with the draft's)
        accepted = torch.randint(0, n + 1, (B,), device=dev)
        for name, x in zip(accepted_tokens, (q, k, v, g, beta)):
            accepted_tokens[name].append([x[b, : int(accepted[b])] for b in range(B)])
        print(f"round {round_}: accepted {accepted.tolist()} of {n}")
    # a sequence that leaves the batch (or the loop's end) flushes its last accepted tokens
    layer.commit(state=pool, state_indices=slots, cache=cache, accepted=accepted)

    # the pool now holds the states of the accepted tokens only: check against the recurrence
    worst = 0.0
    for b in range(B):
        tokens = {name: torch.cat([r[b] for r in rounds])[None] for name, rounds in accepted_tokens.items()}
        if tokens["q"].shape[1] == 0:
            continue
        _, final = layer.recurrent(**{k: v.contiguous() for k, v in tokens.items()},
                                   initial_state=start[b : b + 1].contiguous(), output_final_state=True)
        worst = max(worst, ((pool[slots[b]] - final[0]).norm() / final[0].norm()).item())
    print(f"pool vs recurrence over the accepted tokens: worst RMS ratio {worst:.2e}")


if __name__ == "__main__":
    main()
