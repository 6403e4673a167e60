"""The LatentMoE layer's dispatch table: which plan runs a call of R token rows, and at what
tiles. lower-moe-experts' `dispatch` option spells it as buckets of increasing row bounds,
`MAX=PLAN` separated by commas, the rows above the last bound going to prefill:

    1=split,4=warp/4x128     R <= 1: decode = split; R <= 4: decode = warp at BN 4, BD 128;
                             R > 4: moe_prefill

Plans: split and warp (the token-centric decode plans), prefill (the expert-centric plan).
warp may name its kernels' launch tiles, /BNxBD (output by input columns per step, powers of
two); without them it takes the pass's warp-block-n and warp-block-d. The table becomes the
`moe` entry's k3s.entry_by_rows (its buckets) and k3s.launch_by_rows ops of the warp entry's
kernels (each bucket's tiles); `k3c tune` writes a tuned table into this same option
(docs/autotuning.md, "LatentMoE").
"""

from __future__ import annotations

from dataclasses import dataclass

PLANS = ("split", "warp", "prefill")
DECODE_PLANS = ("split", "warp")

# bf16 expert weights, the default: the plan with the largest share of the weight-bytes floor
# at each token count an H100 measured (bench/results/moe_decode_plans_h100_f3f7295.md, CUDA
# graphs, K3's dims): split 83/89/66/28% at 1/4/16/64 tokens, warp (4x128, teams of 4)
# 78/94/81/43%, moe_prefill 79/87/89/88%. The bounds are the measured counts: 2-3 tokens and
# 5-15 are not measured yet. warp ran at the pass's tiles (warp-block-n 4, warp-block-d 128),
# which a bucket without its own takes
H100_TABLE = "1=split,4=warp"


@dataclass(frozen=True)
class Bucket:
    """Calls of at most max_rows token rows (None: any more) run `plan`; a warp bucket at its
    launch tiles (block_n, block_d), None where the pass's own apply."""

    max_rows: int | None
    plan: str
    block_n: int | None = None
    block_d: int | None = None

    def spelled(self) -> str:
        tiles = f"/{self.block_n}x{self.block_d}" if self.block_n is not None else ""
        return f"{self.max_rows}={self.plan}{tiles}"


def parse_table(text: str, where: str = "dispatch") -> list[Bucket]:
    """The buckets of a table spelled as above, the implicit last (prefill, any rows) included;
    a malformed entry raises a one-line ValueError naming it."""
    buckets: list[Bucket] = []
    for item in [part.strip() for part in text.split(",")] if text.strip() else []:
        bound, _, plan = item.partition("=")
        plan, _, tiles = plan.partition("/")
        if not bound.strip().isdigit() or int(bound) < 1:
            raise ValueError(f"{where}: bucket {item!r}: expected MAX=PLAN with MAX a positive row count")
        if plan not in PLANS:
            raise ValueError(f"{where}: bucket {item!r}: plan must be one of {', '.join(PLANS)}, got {plan!r}")
        sizes = tiles.split("x") if tiles else []
        if tiles and (plan != "warp" or len(sizes) != 2 or not all(size.isdigit() for size in sizes)):
            raise ValueError(f"{where}: bucket {item!r}: only warp takes tiles, as warp/BNxBD")
        block_n, block_d = (int(size) for size in sizes) if sizes else (None, None)
        for name, size in (("BN", block_n), ("BD", block_d)):
            if size is not None and (size < 1 or size & (size - 1) or size > 1024):
                raise ValueError(f"{where}: bucket {item!r}: {name} must be a power of two up to 1024, got {size}")
        if buckets and int(bound) <= buckets[-1].max_rows:
            raise ValueError(f"{where}: bucket {item!r}: row bounds must increase (after {buckets[-1].max_rows})")
        buckets.append(Bucket(int(bound), plan, block_n, block_d))
    return [*buckets, Bucket(None, "prefill")]


def spell_table(buckets: list[Bucket]) -> str:
    """The option's spelling of a table (its implicit last bucket left out)."""
    return ",".join(bucket.spelled() for bucket in buckets if bucket.max_rows is not None)
