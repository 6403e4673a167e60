"""Prefix-cache policies for a hybrid (attention + KDA) model, simulated over synthetic traces.

    .venv/bin/python examples/prefix_cache_sim.py               # CPU, a few seconds
    .venv/bin/python examples/prefix_cache_sim.py --requests 200 --no-plot --out DIR

It writes prefix_cache_sim.md (and, with matplotlib, prefix_cache_sim.png) to --out, a new
temporary folder unless named; the tracked bench/results/prefix_cache_sim.md and
docs/prefix_cache_sim.png are what `--out bench/results --plot docs/prefix_cache_sim.png` writes.

Every policy is the real `k3compile.runtime.serving.PrefixCache`, driven with token ids:

- ours-nN: 512-token blocks, a KDA checkpoint every N blocks and at each prompt's last full block
  (CheckpointPolicy(every_blocks=N));
- every-block: 512-token blocks with a checkpoint at every block end (every_blocks=1): the best
  a 512-token cache can resume, at the most state memory;
- aligned-B: vLLM's aligned mode, one block size B for attention pages and states, inflated
  towards the state's size (PrefixCache(block_tokens=B), every_blocks=1): a hit only at
  multiples of B, the state at every such block.

Each request, in arrival order, is served as an engine would (docs/prefix-cache.md): look up the
prompt but its last token, prefill from the hit's state_tokens (the chunk entry's checkpoints at
every block end from there on), insert the prompt with those checkpoints, release the hit. The
states are 4-byte dummies; each stands for one true checkpoint, counted at K3's size: per KDA
layer HV x K x V fp32 = 32 * 128 * 128 * 4 bytes (2 MiB), times --kda-layers. Every policy runs
without a checkpoint budget and under each --budget-gib (in true bytes), the same for all.

Traces (seeded; token ids uniform in [0, VOCAB): only equality matters to the block hashes):

- chat: multi-turn conversations under a few system prompts (4, median 1500 tokens, Zipf
  popularity); each turn's prompt is the previous one plus the assistant's reply (median 350)
  and the next user message (median 120); 4 turns a conversation on average; a conversation
  starts every 10 s, its turns 90 s apart on average, so conversations interleave.
- agent: coding-agent tasks under one system prompt with tool schemas (5000 tokens) and one of
  8 repository contexts (median 3000, Zipf); a task reads one long tool output (median 8000)
  and 1-4 parallel branches (sub-agents, retries) continue from it, each with steps of a tool
  call (median 80) and its output (median 1200); every step is a request with the context so far.
- template: single-turn prompts under one shared template (instructions and few-shot examples,
  drawn once: median 2500 tokens) followed by a unique input (median 250).
- unique: prompts with nothing shared (a control: no policy may hit).

Lengths are log-normal, clipped; arrivals Poisson. Only the prompt is cached (prefill), not the
generated tokens; blocks (attention pages) are never evicted: the KV pool is assumed to hold
the trace; requests run one at a time.

KDA recompute cost of a hit: recompute_tokens x --kda-layers x the time per token of one KDA
layer's chunk prefill on one H200, from bench/RESULTS.md (see CHUNK_ROW below). The GPU cost of
a hit was not measured separately for this simulation; the attention and MoE layers of the
recomputed tokens are not counted.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from k3compile.runtime.serving import CheckpointPolicy, PrefixCache

VOCAB = 160_000
BLOCK_TOKENS = 512
STATE_BYTES_PER_LAYER = 32 * 128 * 128 * 4  # HV x K x V fp32 at K3's dimensions: 2 MiB
DUMMY_STATE = torch.zeros(1, 1, 1)  # stands for one whole checkpoint (all KDA layers)
DUMMY_BYTES = DUMMY_STATE.numel() * DUMMY_STATE.element_size()
GIB = 1 << 30

# The H200 figure a hit's KDA recompute is costed with: short sequences at K3's 32 heads, like a
# recompute of a few blocks, batched 16 at a time (so it assumes recomputes share a prefill batch;
# one alone pays more of the launch overhead).
CHUNK_ROW = ("bench/RESULTS.md (at b1e5e41), \"Chunk prefill against fla with matched gate semantics (k3compile "
             "9e680ea)\", row KDA B16 T1024 H32, gates >= -5, ours clamped: 0.835 ms for 16 x 1024 tokens, bf16")
CHUNK_ROW_MS, CHUNK_ROW_TOKENS = 0.835, 16 * 1024
KDA_MS_PER_TOKEN_PER_LAYER = CHUNK_ROW_MS / CHUNK_ROW_TOKENS


# --- traces ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """A prompt as the segments it is made of (shared segments are shared objects, so a trace of
    long conversations stays small until a prompt is served)."""

    arrival: float
    segments: tuple[torch.Tensor, ...]

    def tokens(self) -> torch.Tensor:
        return torch.cat(self.segments)

    def __len__(self) -> int:
        return sum(len(s) for s in self.segments)


class _Draw:
    """Seeded draws of token segments, lengths, choices and arrival times."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def length(self, median: float, sigma: float, low: int, high: int) -> int:
        return int(np.clip(round(median * np.exp(sigma * self.rng.standard_normal())), low, high))

    def ids(self, count: int) -> torch.Tensor:
        return torch.from_numpy(self.rng.integers(0, VOCAB, count, dtype=np.int64))

    def tokens(self, median: float, sigma: float, low: int, high: int) -> torch.Tensor:
        return self.ids(self.length(median, sigma, low, high))

    def choice(self, weights) -> int:
        """An index drawn with the given relative weights."""
        weights = np.asarray(weights, dtype=float)
        return int(self.rng.choice(len(weights), p=weights / weights.sum()))

    def zipf(self, count: int) -> int:
        """An index in 0..count-1, index i drawn with weight 1 / (i + 1)."""
        return self.choice(1.0 / np.arange(1, count + 1))

    def turns(self, mean: float, cap: int) -> int:
        return int(min(self.rng.geometric(1.0 / mean), cap))

    def gap(self, mean_s: float) -> float:
        return float(self.rng.exponential(mean_s))


def _first(requests: list[Request], count: int) -> list[Request]:
    """The first `count` requests in arrival order."""
    return sorted(requests, key=lambda r: r.arrival)[:count]


def chat_trace(count: int, seed: int) -> list[Request]:
    draw = _Draw(seed)
    systems = [draw.tokens(1500, 0.6, 300, 6000) for _ in range(4)]
    requests: list[Request] = []
    start = 0.0
    while len(requests) < count:
        start += draw.gap(10.0)
        context = (systems[draw.zipf(len(systems))], draw.tokens(120, 1.0, 5, 4000))
        now = start
        for _ in range(draw.turns(4.0, 30)):
            requests.append(Request(now, context))
            context += (draw.tokens(350, 0.8, 20, 4000), draw.tokens(120, 1.0, 5, 4000))  # reply, next message
            now += draw.gap(90.0)
    return _first(requests, count)


def agent_trace(count: int, seed: int) -> list[Request]:
    draw = _Draw(seed)
    system = draw.ids(5000)
    repositories = [draw.tokens(3000, 0.8, 500, 16000) for _ in range(8)]
    requests: list[Request] = []
    start = 0.0
    while len(requests) < count:
        start += draw.gap(20.0)
        shared = (system, repositories[draw.zipf(len(repositories))], draw.tokens(200, 0.8, 20, 2000),
                  draw.tokens(60, 0.5, 10, 400), draw.tokens(8000, 0.7, 1000, 32000))  # task, call, long output
        requests.append(Request(start, shared))
        for _ in range(1 + draw.choice([0.4, 0.3, 0.2, 0.1])):  # branches
            context, now = shared, start
            for _ in range(draw.turns(6.0, 25)):
                now += draw.gap(8.0)
                context += (draw.tokens(80, 0.5, 10, 600), draw.tokens(1200, 1.0, 20, 16000))  # call, output
                requests.append(Request(now, context))
    return _first(requests, count)


def template_trace(count: int, seed: int) -> list[Request]:
    draw = _Draw(seed)
    template = draw.tokens(2500, 0.4, 800, 6000)
    now, requests = 0.0, []
    for _ in range(count):
        now += draw.gap(1.0)
        requests.append(Request(now, (template, draw.tokens(250, 0.8, 10, 3000))))
    return requests


def unique_trace(count: int, seed: int) -> list[Request]:
    draw = _Draw(seed)
    now, requests = 0.0, []
    for _ in range(count):
        now += draw.gap(1.0)
        requests.append(Request(now, (draw.tokens(2000, 0.8, 100, 16000),)))
    return requests


TRACES: dict[str, Callable[[int, int], list[Request]]] = dict(
    chat=chat_trace, agent=agent_trace, template=template_trace, unique=unique_trace)


# --- policies and the simulation ---------------------------------------------------------------


@dataclass(frozen=True)
class Policy:
    name: str
    block_tokens: int
    every_blocks: int


def policies(every: list[int], aligned_blocks: list[int]) -> list[Policy]:
    return [*(Policy(f"ours-n{n}", BLOCK_TOKENS, n) for n in every), Policy("every-block", BLOCK_TOKENS, 1),
            *(Policy(f"aligned-{b}", b, 1) for b in aligned_blocks)]


@dataclass
class Outcome:
    """One policy over one trace under one checkpoint budget (true bytes; None: none): per
    request, in arrival order, its prompt length and what its lookup returned; the checkpoint
    bytes held (true bytes) and how many checkpoints the budget evicted."""

    trace: str
    policy: Policy
    budget_bytes: int | None
    prompt_tokens: list[int] = field(default_factory=list)
    matched: list[int] = field(default_factory=list)
    resumed: list[int] = field(default_factory=list)
    recomputed: list[int] = field(default_factory=list)
    peak_bytes: int = 0
    final_bytes: int = 0
    evicted_checkpoints: int = 0

    @property
    def hits(self) -> int:
        return sum(m > 0 for m in self.matched)

    @property
    def hit_rate(self) -> float:
        return self.hits / len(self.matched) if self.matched else 0.0

    def share(self, tokens: list[int]) -> float:
        """tokens (matched, resumed, ...) summed, as a share of all prompt tokens."""
        return sum(tokens) / max(sum(self.prompt_tokens), 1)

    def recompute_ms(self, kda_layers: int) -> tuple[float, float]:
        """The KDA recompute of a hit, estimated: the mean over hits and the largest."""
        per_token = kda_layers * KDA_MS_PER_TOKEN_PER_LAYER
        return sum(self.recomputed) * per_token / max(self.hits, 1), max(self.recomputed, default=0) * per_token


def simulate(trace: str, requests: list[Request], policy: Policy, checkpoint_bytes: int,
             budget_bytes: int | None) -> Outcome:
    """Serve `requests` in order through a PrefixCache run by `policy`. checkpoint_bytes: the
    true size of one checkpoint (all KDA layers)."""
    # the cache holds dummies, so its budget is the true budget in whole checkpoints
    max_dummy_bytes = None if budget_bytes is None else budget_bytes // checkpoint_bytes * DUMMY_BYTES
    cache = PrefixCache(block_tokens=policy.block_tokens, policy=CheckpointPolicy(every_blocks=policy.every_blocks),
                        max_checkpoint_bytes=max_dummy_bytes)
    outcome, peak = Outcome(trace, policy, budget_bytes), 0
    block = policy.block_tokens
    for request in requests:
        prompt = request.tokens()
        with cache.lookup(prompt[:-1]) as hit:  # keep the last token to compute (its logits)
            # the prefill from state_tokens yields the state at every block end after it; the
            # cache keeps those its policy wants (insert while the hit pins what it matched)
            full = len(prompt) // block * block
            computed = {p: DUMMY_STATE for p in range(hit.state_tokens + block, full + 1, block)}
            cache.insert(prompt, computed)
            peak = max(peak, cache.stats().checkpoint_bytes)
        outcome.prompt_tokens.append(len(prompt))
        outcome.matched.append(hit.matched_tokens)
        outcome.resumed.append(hit.state_tokens)
        outcome.recomputed.append(hit.recompute_tokens)
    stats = cache.stats()
    outcome.peak_bytes = peak // DUMMY_BYTES * checkpoint_bytes
    outcome.final_bytes = stats.checkpoint_bytes // DUMMY_BYTES * checkpoint_bytes
    outcome.evicted_checkpoints = stats.evicted_checkpoints
    return outcome


# --- report ------------------------------------------------------------------------------------


def _tokens(n: int) -> str:
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.1f}k"


def trace_table(traces: dict[str, list[Request]]) -> list[str]:
    lines = ["| trace | requests | prompt tokens | mean | p50 | p90 | max |", "|---|---|---|---|---|---|---|"]
    for name, requests in traces.items():
        lengths = np.array([len(r) for r in requests])
        lines.append(f"| {name} | {len(requests)} | {_tokens(int(lengths.sum()))} | {lengths.mean():.0f} | "
                     f"{np.percentile(lengths, 50):.0f} | {np.percentile(lengths, 90):.0f} | {lengths.max()} |")
    return lines


def unbounded_table(outcomes: list[Outcome], kda_layers: int) -> list[str]:
    lines = ["| trace | policy | hit rate | attention reused (matched) | KDA resumed (prefill saved) | recomputed | "
             "KDA recompute ms / hit, mean / max | checkpoint GiB held |", "|---|---|---|---|---|---|---|---|"]
    for o in outcomes:
        mean_ms, max_ms = o.recompute_ms(kda_layers)
        lines.append(f"| {o.trace} | {o.policy.name} | {o.hit_rate:.1%} | {_tokens(sum(o.matched))} "
                     f"({o.share(o.matched):.1%}) | {_tokens(sum(o.resumed))} ({o.share(o.resumed):.1%}) | "
                     f"{_tokens(sum(o.recomputed))} | {mean_ms:.2f} / {max_ms:.2f} | {o.final_bytes / GIB:.1f} |")
    return lines


def budget_table(outcomes: list[Outcome], kda_layers: int) -> list[str]:
    lines = ["| trace | policy | budget GiB | KDA resumed (prefill saved) | recomputed | "
             "KDA recompute ms / hit, mean / max | checkpoint GiB, peak / final | checkpoints evicted |",
             "|---|---|---|---|---|---|---|---|"]
    for o in outcomes:
        mean_ms, max_ms = o.recompute_ms(kda_layers)
        lines.append(f"| {o.trace} | {o.policy.name} | {o.budget_bytes / GIB:g} | {_tokens(sum(o.resumed))} "
                     f"({o.share(o.resumed):.1%}) | {_tokens(sum(o.recomputed))} | {mean_ms:.2f} / {max_ms:.2f} | "
                     f"{o.peak_bytes / GIB:.1f} / {o.final_bytes / GIB:.1f} | {o.evicted_checkpoints} |")
    return lines


def report(args, traces: dict[str, list[Request]], outcomes: list[Outcome], checkpoint_bytes: int,
           seconds: float) -> str:
    command = " ".join([".venv/bin/python examples/prefix_cache_sim.py", *args.argv])
    budgets = ", ".join(f"{b:g} GiB ({int(b * GIB) // checkpoint_bytes} checkpoints)" for b in args.budget_gib)
    lines = [
        "# Prefix-cache policies for a hybrid model: hit rate, KDA resume and checkpoint memory",
        "",
        f"`{command}` (seed {args.seed}, {args.requests} requests a trace; {seconds:.1f} s on the CPU). "
        "Synthetic traces, described in the script's docstring.",
        "",
        "Assumptions:",
        f"- a checkpoint holds {args.kda_layers} KDA layers (an assumption: K3's layer count is not in this "
        f"repository) of HV x K x V fp32 = 32 x 128 x 128 x 4 B = 2 MiB: {checkpoint_bytes / (1 << 20):.0f} MiB;",
        f"- checkpoint budgets: none, then {budgets}, the same for every policy, least recently used "
        "checkpoints evicted first;",
        "- attention pages (blocks) are never evicted, so hits and matched tokens do not depend on the budget; "
        "only prompts are cached (not generated tokens); requests are served one at a time in arrival order, "
        "looking up the prompt but its last token;",
        f"- KDA recompute ms / hit = recomputed tokens x {args.kda_layers} layers x "
        f"{KDA_MS_PER_TOKEN_PER_LAYER * 1e6:.1f} ns, one KDA layer's chunk prefill per token on one H200: "
        f"{CHUNK_ROW}. Not measured separately for this simulation; the attention "
        "and MoE layers of the recomputed tokens are not counted.",
        "",
        "Traces:",
        "",
        *trace_table(traces),
        "",
        "Policies: ours-nN = 512-token blocks, a checkpoint every N blocks and at each prompt's last full block; "
        "every-block = 512-token blocks, a checkpoint at every block end; aligned-B = one block of B tokens for "
        "attention and state (vLLM's aligned mode), a checkpoint at every block. Hit rate: requests with "
        "matched_tokens > 0. Attention reused: matched tokens (share of all prompt tokens); KDA resumed: "
        "state_tokens, the prefill tokens not computed again; recomputed: matched - resumed.",
        "",
        "Without a budget (checkpoints held only grow: peak = final):",
        "",
        *unbounded_table([o for o in outcomes if o.budget_bytes is None], args.kda_layers),
        "",
        "Under a checkpoint budget (hit rate and attention reused as above):",
        "",
        *budget_table([o for o in outcomes if o.budget_bytes is not None], args.kda_layers),
    ]
    return "\n".join(lines) + "\n"


def plot(outcomes: list[Outcome], path: Path) -> bool:
    """Hit rate, prefill saved under each budget and checkpoint memory without one, per trace
    and policy; False when matplotlib is missing (it is not a dependency of the project)."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    traces = list(dict.fromkeys(o.trace for o in outcomes))
    names = list(dict.fromkeys(o.policy.name for o in outcomes))
    budgets = list(dict.fromkeys(o.budget_bytes for o in outcomes if o.budget_bytes is not None))
    by_key = {(o.trace, o.policy.name, o.budget_bytes): o for o in outcomes}
    panels = [("hit rate (%)", None, lambda o: 100 * o.hit_rate),
              *((f"prefill saved, {b / GIB:g} GiB budget (%)", b, lambda o: 100 * o.share(o.resumed))
                for b in budgets),
              ("checkpoint GiB held, no budget", None, lambda o: o.final_bytes / GIB)]
    figure, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4.2))
    width = 0.8 / len(names)
    for axis, (title, budget, value) in zip(axes, panels):
        for i, name in enumerate(names):
            xs = [t + (i - (len(names) - 1) / 2) * width for t in range(len(traces))]
            axis.bar(xs, [value(by_key[trace, name, budget]) for trace in traces], width, label=name)
        axis.set_xticks(range(len(traces)), traces)
        axis.set_title(title, fontsize=10)
        axis.grid(axis="y", alpha=0.3)
    for budget in budgets:
        axes[-1].axhline(budget / GIB, color="black", linestyle="--", linewidth=0.8)
        axes[-1].annotate(f"{budget / GIB:g} GiB", (axes[-1].get_xlim()[0], budget / GIB), fontsize=8,
                          va="bottom")
    figure.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=len(names), fontsize=9)
    figure.tight_layout(rect=(0, 0.07, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True


def run(args) -> tuple[str, list[Outcome]]:
    """Generate the traces, simulate every policy on each without a budget and under each
    budget, and return the report and the outcomes."""
    began = time.perf_counter()
    checkpoint_bytes = args.kda_layers * STATE_BYTES_PER_LAYER
    budgets = [None, *(int(b * GIB) for b in args.budget_gib)]
    traces = {name: TRACES[name](args.requests, args.seed + i) for i, name in enumerate(args.traces)}
    outcomes = [simulate(name, requests, policy, checkpoint_bytes, budget)
                for name, requests in traces.items() for budget in budgets
                for policy in policies(args.every, args.aligned_blocks)]
    return report(args, traces, outcomes, checkpoint_bytes, time.perf_counter() - began), outcomes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--requests", type=int, default=1000, help="requests per trace")
    parser.add_argument("--traces", nargs="+", choices=list(TRACES), default=["chat", "agent", "template"])
    parser.add_argument("--every", type=int, nargs="+", default=[4, 8], help="ours: a checkpoint every N blocks")
    parser.add_argument("--aligned-blocks", type=int, nargs="+", default=[2112, 8320],
                        help="aligned mode's block sizes (tokens)")
    parser.add_argument("--kda-layers", type=int, default=48, help="KDA layers a checkpoint holds")
    parser.add_argument("--budget-gib", type=float, nargs="+", default=[16.0, 64.0],
                        help="checkpoint byte budgets (GiB, true bytes), each run besides a run without one")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for prefix_cache_sim.md and the plot (default: a new temporary folder)")
    parser.add_argument("--plot", type=Path, default=None, help="the plot's path (default: OUT/prefix_cache_sim.png)")
    parser.add_argument("--no-plot", action="store_true")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    args.argv = argv  # quoted in the report as the command that made it
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    text, outcomes = run(args)
    print(text)
    # never into the repository unless asked: its copies are the tracked results
    out = args.out or Path(tempfile.mkdtemp(prefix="prefix_cache_sim_"))
    out.mkdir(parents=True, exist_ok=True)
    table = out / "prefix_cache_sim.md"
    table.write_text(text)
    print(f"wrote {table}")
    if not args.no_plot:
        figure = args.plot or out / "prefix_cache_sim.png"
        if plot(outcomes, figure):
            print(f"wrote {figure}")
        else:
            print("matplotlib is not installed (not a project dependency): no plot; "
                  "`.venv/bin/python -m pip install matplotlib` to draw it")


if __name__ == "__main__":
    # the tensors here are token ids, small: torch's thread pool only spins against other work
    # (on a busy 2-core machine one thread made the run 6x faster)
    torch.set_num_threads(1)
    main()
