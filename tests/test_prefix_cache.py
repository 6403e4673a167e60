"""k3compile.runtime.serving.PrefixCache: chained block hashes, the checkpoint policy, pins against
eviction, the checkpoint byte budget, stats, bad inputs, a many-thread stress test, and the
kernel path of a hit (resume a compiled KDA / Gated DeltaNet chunk entry from a cached
checkpoint and compare with a full prefill of the same prompt).

The unit tests use tiny blocks (4 tokens) and synthetic states: each prefix's state is a
function of its token ids (`state_of`), so a hit's state can be checked against the prefix it
claims to be. The kernel tests run in Triton's interpreter in fp32 with 32-token blocks over
16-token chunks.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
import zlib

import pytest
import torch

from conftest import RecurrenceShape, assert_matches, one_line, recurrence_inputs, recurrence_table
from k3compile.runtime.serving import CheckpointPolicy, PrefixCache, PrefixHit, block_keys, split_checkpoints

BT = 4  # block_tokens of the unit tests
SHAPE = (2, 3, 3)  # [HV, K, V] of the synthetic states


def state_of(tokens, shape=SHAPE) -> torch.Tensor:
    """A synthetic state that is a function of the prefix's token ids (stands in for the KDA
    state after them)."""
    generator = torch.Generator().manual_seed(zlib.crc32(repr(list(tokens)).encode()))
    return torch.randn(shape, generator=generator)


def all_checkpoints(tokens, block_tokens=BT, shape=SHAPE) -> dict[int, torch.Tensor]:
    """The state at every block end of a prompt, as chunk(checkpoint_every=block_tokens) gives."""
    return {p: state_of(tokens[:p], shape) for p in range(block_tokens, len(tokens) + 1, block_tokens)}


def prompt(length: int, vocab: int = 1000) -> list[int]:
    return torch.randint(0, vocab, (length,)).tolist()


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


# --- hashing and matching ------------------------------------------------------------------------


def test_block_keys_are_chained_and_skip_partial_blocks():
    tokens = prompt(4 * BT + 3)
    keys = block_keys(tokens, BT)
    assert len(keys) == 4, "the partial last block has no key"
    assert keys == block_keys(torch.tensor(tokens), BT) == block_keys(torch.tensor(tokens, dtype=torch.int32), BT)
    for i in range(4 * BT):
        changed = list(tokens)
        changed[i] += 1
        other = block_keys(changed, BT)
        block = i // BT
        assert other[:block] == keys[:block], f"a change at token {i} must keep the blocks before {block}"
        assert all(a != b for a, b in zip(other[block:], keys[block:])), f"token {i}: blocks >= {block} must change"
    # the same block content after a different prefix is a different block
    moved = prompt(BT) + tokens[BT:2 * BT]
    assert block_keys(moved, BT)[1] != keys[1]


def test_lookup_matches_whole_cached_blocks_only():
    cache = PrefixCache(block_tokens=BT)
    tokens = prompt(3 * BT + 2)
    cache.insert(tokens, pages=["p0", "p1", "p2"])
    cases = [
        (tokens, 3 * BT), (tokens + prompt(9), 3 * BT), (tokens[:3 * BT], 3 * BT), (tokens[:3 * BT - 1], 2 * BT),
        (tokens[:BT - 1], 0), ([], 0),
    ]
    for i in range(3 * BT):
        changed = list(tokens)
        changed[i] = (changed[i] + 1) % 1000
        cases.append((changed, (i // BT) * BT))
    for query, matched in cases:
        with cache.lookup(query) as hit:
            assert hit.matched_tokens == matched, (len(query), hit)
            assert hit.pages == ("p0", "p1", "p2")[:matched // BT]
            assert hit.state is None and hit.state_tokens == 0 and hit.recompute_tokens == matched


# --- checkpoints -----------------------------------------------------------------------------------


def test_checkpoint_policy_keeps_every_nth_block_end_and_the_prompt_end():
    tokens = prompt(11 * BT + 3)
    given = all_checkpoints(tokens)
    cache = PrefixCache(block_tokens=BT, policy=CheckpointPolicy(every_blocks=3))
    inserted = cache.insert(tokens, given)
    assert inserted.new_blocks == 11
    assert inserted.checkpoint_positions == tuple(b * BT for b in (3, 6, 9, 11))
    no_end = PrefixCache(block_tokens=BT, policy=CheckpointPolicy(every_blocks=3, at_prompt_end=False))
    assert no_end.insert(tokens, given).checkpoint_positions == tuple(b * BT for b in (3, 6, 9))
    assert CheckpointPolicy().every_blocks == 4 and PrefixCache().block_tokens == 512
    for blocks in range(12):  # a prompt sharing `blocks` blocks, then different tokens
        query = tokens[:blocks * BT] + [1000 + i for i in range(BT + 1)]
        with cache.lookup(query) as hit:
            expected = max([b for b in (3, 6, 9, 11) if b <= blocks], default=0) * BT
            assert (hit.matched_tokens, hit.state_tokens) == (blocks * BT, expected)
            assert hit.recompute_tokens == blocks * BT - expected
            if expected:
                assert torch.equal(hit.state, state_of(tokens[:expected]))
                assert hit.state is not given[expected], "the cache keeps its own copy"
            else:
                assert hit.state is None


def test_existing_blocks_keep_their_pages_and_checkpoints():
    tokens = prompt(4 * BT)
    cache = PrefixCache(block_tokens=BT, policy=CheckpointPolicy(every_blocks=2))
    first = cache.insert(tokens[:2 * BT], all_checkpoints(tokens[:2 * BT]), pages=["a0", "a1"])
    assert (first.new_blocks, first.checkpoint_positions, first.unused_pages) == (2, (2 * BT,), ())
    # the same states again at 2 blocks: the copy held stays; the caller's pages of cached blocks come back
    second = cache.insert(tokens, all_checkpoints(tokens), pages=["b0", "b1", "b2", "b3"])
    assert (second.new_blocks, second.checkpoint_positions, second.unused_pages) == (2, (4 * BT,), ("b0", "b1"))
    with cache.lookup(tokens) as hit:
        assert hit.pages == ("a0", "a1", "b2", "b3")
        assert torch.equal(hit.state, state_of(tokens))
        # an engine that passes the entries of its hit gets nothing back for them
        longer = tokens + prompt(BT)
        third = cache.insert(longer, all_checkpoints(longer), pages=[*hit.pages, "c4"])
    assert (third.new_blocks, third.unused_pages) == (1, ())


def test_checkpoints_of_several_layers():
    shapes = [(2, 3, 3), (4, 2, 5)]  # e.g. a KDA and a Gated DeltaNet layer of one model
    tokens = prompt(2 * BT + 1)
    cache = PrefixCache(block_tokens=BT, policy=CheckpointPolicy(every_blocks=1))
    layers = [{p: state_of(tokens[:p] + [layer], shape) for p in (BT, 2 * BT)} for layer, shape in enumerate(shapes)]
    cache.insert(tokens, layers)
    with cache.lookup(tokens[:BT + 2]) as hit:
        assert hit.state_tokens == BT and isinstance(hit.state, tuple) and len(hit.state) == 2
        for layer, state in enumerate(hit.state):
            assert torch.equal(state, state_of(tokens[:BT] + [layer], shapes[layer]))
    assert cache.stats().checkpoint_bytes == 2 * sum(nbytes(torch.empty(s)) for s in shapes)


# --- pins, eviction, the byte budget, stats --------------------------------------------------------


def test_evict_takes_lru_leaves_and_never_pinned_blocks_or_their_prefix():
    cache = PrefixCache(block_tokens=BT)
    trunk = prompt(2 * BT)
    a, b = trunk + prompt(BT), trunk + prompt(2 * BT)
    cache.insert(a, pages=["t0", "t1", "a2"])
    cache.insert(b, pages=["t0'", "t1'", "b2", "b3"])
    hit = cache.lookup(a)  # pins t0, t1, a2 and makes them the most recent
    evicted = cache.evict(blocks=10)
    assert evicted.pages == ("b3", "b2"), "b's own blocks go, deepest first; the pinned prefix stays"
    assert set(evicted.pages).isdisjoint(hit.pages)
    cache.check_invariants()
    hit_b = cache.lookup(trunk)  # pins only the trunk
    cache.release(hit)
    assert cache.evict(blocks=10).pages == ("a2",), "the trunk is pinned by hit_b"
    cache.release(hit_b)
    assert cache.evict(blocks=1).pages == ("t1",) and cache.evict(blocks=5).pages == ("t0",)
    assert cache.stats().blocks == 0 and cache.stats().evicted_blocks == 5


def test_lru_order_of_blocks_follows_lookups():
    cache = PrefixCache(block_tokens=BT)
    prompts = [prompt(BT) for _ in range(4)]
    for i, tokens in enumerate(prompts):
        cache.insert(tokens, pages=[i])
    cache.release(cache.lookup(prompts[0]))  # 0 is now the most recently used
    assert cache.evict(blocks=3).pages == (1, 2, 3)


def test_byte_budget_evicts_least_recently_used_unpinned_checkpoints():
    one = nbytes(state_of([]))
    cache = PrefixCache(block_tokens=BT, policy=CheckpointPolicy(every_blocks=1), max_checkpoint_bytes=2 * one)
    prompts = [prompt(BT) for _ in range(4)]
    cache.insert(prompts[0], all_checkpoints(prompts[0]))
    cache.insert(prompts[1], all_checkpoints(prompts[1]))
    cache.release(cache.lookup(prompts[0]))  # 1 is now the least recently used checkpoint
    cache.insert(prompts[2], all_checkpoints(prompts[2]))
    states = {i: cache.lookup(p) for i, p in enumerate(prompts[:3])}
    assert [states[i].state_tokens for i in range(3)] == [BT, 0, BT]
    assert cache.stats().checkpoint_bytes == 2 * one
    # both held checkpoints pinned: a new one over the budget goes at once, the pinned ones stay
    inserted = cache.insert(prompts[3], all_checkpoints(prompts[3]))
    assert inserted.checkpoint_positions == () and cache.stats().checkpoints == 2
    # a budget of one: the new checkpoint stays while pinned, the budget applies at release
    tight = PrefixCache(block_tokens=BT, policy=CheckpointPolicy(every_blocks=1), max_checkpoint_bytes=one)
    tight.insert(prompts[0], all_checkpoints(prompts[0]))
    pinned = tight.lookup(prompts[0])
    tight.insert(prompts[1], all_checkpoints(prompts[1]))  # evicts itself: the other is pinned
    assert tight.stats().checkpoints == 1
    pinned_too = tight.lookup(prompts[0])
    tight.release(pinned)
    assert torch.equal(pinned_too.state, state_of(prompts[0]))
    tight.check_invariants()
    for hit in [*states.values(), pinned_too]:
        hit._cache.release(hit)
    assert PrefixCache(block_tokens=BT, max_checkpoint_bytes=0).insert(prompts[0], all_checkpoints(prompts[0])) \
        .checkpoint_positions == ()


def test_evict_checkpoint_bytes_and_blocks_take_their_checkpoints():
    tokens = prompt(4 * BT)
    cache = PrefixCache(block_tokens=BT, policy=CheckpointPolicy(every_blocks=1))
    cache.insert(tokens, all_checkpoints(tokens))
    one = nbytes(state_of([]))
    evicted = cache.evict(checkpoint_bytes=one + 1)  # whole checkpoints: two of them
    assert (evicted.blocks, evicted.checkpoints, evicted.checkpoint_bytes, evicted.pages) == (0, 2, 2 * one, ())
    with cache.lookup(tokens) as hit:
        assert hit.state_tokens == 4 * BT, "the oldest checkpoints (the first block ends) went first"
    evicted = cache.evict(blocks=1)
    assert (evicted.blocks, evicted.checkpoints, evicted.checkpoint_bytes) == (1, 1, one)
    with cache.lookup(tokens) as hit:
        assert (hit.matched_tokens, hit.state_tokens) == (3 * BT, 3 * BT)


def test_stats_count_lookups_hits_tokens_and_bytes():
    cache = PrefixCache(block_tokens=BT, policy=CheckpointPolicy(every_blocks=2, at_prompt_end=False))
    tokens = prompt(5 * BT)
    cache.insert(tokens, all_checkpoints(tokens))
    hits = [cache.lookup(tokens), cache.lookup(tokens[:3 * BT]), cache.lookup(prompt(3 * BT))]
    stats = cache.stats()
    assert (stats.lookups, stats.hits, stats.live_hits) == (3, 2, 3)
    assert (stats.tokens_matched, stats.tokens_resumed, stats.tokens_recomputed) == (8 * BT, 6 * BT, 2 * BT)
    assert (stats.blocks, stats.checkpoints, stats.checkpoint_bytes) == (5, 2, 2 * nbytes(state_of([])))
    for hit in hits:
        cache.release(hit)
    assert cache.stats().live_hits == 0


def test_split_checkpoints_positions():
    every = 2
    rows = torch.randn(3, 4, *SHAPE)  # B = 3 rows of T = 8 tokens
    split = split_checkpoints(rows, every, start=[0, 6, 10])
    assert [sorted(d) for d in split] == [[2, 4, 6, 8], [8, 10, 12, 14], [12, 14, 16, 18]]
    assert torch.equal(split[1][12], rows[1, 2])
    flat = torch.randn(5, *SHAPE)  # varlen 5, 1, 6 tokens: 2, 0 and 3 checkpoints
    split = split_checkpoints(flat, every, torch.tensor([0, 5, 6, 12]), start=4)
    assert [sorted(d) for d in split] == [[6, 8], [], [6, 8, 10]]
    assert torch.equal(split[2][10], flat[4])


# --- bad input: ValueError/TypeError naming the argument, one line -------------------------------


def bad_cases():
    def inserted_cache(**kw):
        cache = PrefixCache(block_tokens=BT, policy=CheckpointPolicy(every_blocks=1), **kw)
        tokens = list(range(2 * BT))
        cache.insert(tokens, all_checkpoints(tokens))
        return cache

    def released_hit():
        cache = PrefixCache(block_tokens=BT)
        hit = cache.lookup(list(range(BT)))
        cache.release(hit)
        return cache, hit

    tokens = list(range(2 * BT))
    good = state_of(tokens)
    return [
        ("block_tokens", lambda: PrefixCache(block_tokens=0), ValueError, "block_tokens: expected a positive integer, got 0"),
        ("block_tokens bool", lambda: PrefixCache(block_tokens=True), ValueError, "block_tokens: expected a positive"),
        ("budget", lambda: PrefixCache(max_checkpoint_bytes=-1), ValueError, "max_checkpoint_bytes: expected a non-negative"),
        ("policy type", lambda: PrefixCache(policy=4), TypeError, "policy: expected a CheckpointPolicy, got int"),
        ("every_blocks", lambda: CheckpointPolicy(every_blocks=0), ValueError, "every_blocks: expected a positive"),
        ("at_prompt_end", lambda: CheckpointPolicy(at_prompt_end="yes"), TypeError, "at_prompt_end: expected True or"),
        ("2-D ids", lambda: PrefixCache().lookup(torch.zeros(2, 3, dtype=torch.int64)), ValueError,
         "token_ids: expected a 1-D integer tensor, got a int64 tensor of shape (2, 3)"),
        ("float ids", lambda: PrefixCache().lookup(torch.zeros(3)), ValueError, "token_ids: expected a 1-D integer tensor"),
        ("float in list", lambda: PrefixCache().insert([1, 2.0]), ValueError, "token_ids: expected integers, got an element 2.0"),
        ("bool in list", lambda: PrefixCache().lookup([1, True]), ValueError, "token_ids: expected integers, got an element True"),
        ("negative id", lambda: PrefixCache().lookup([3, -1]), ValueError, "token_ids: expected non-negative integers, got -1"),
        ("huge id", lambda: PrefixCache().lookup([2 ** 64]), ValueError, "token_ids: expected integers in 0..2**63-1"),
        ("string ids", lambda: PrefixCache().lookup("abc"), TypeError, "token_ids: expected a 1-D integer tensor or a sequence"),
        ("position not a multiple", lambda: PrefixCache(block_tokens=BT).insert(tokens, {BT + 1: good}), ValueError,
         f"checkpoints: expected positions that are multiples of block_tokens {BT} in {BT}..{2 * BT}"),
        ("position past the prompt", lambda: PrefixCache(block_tokens=BT).insert(tokens, {3 * BT: good}), ValueError,
         f"got {3 * BT}"),
        ("position 0", lambda: PrefixCache(block_tokens=BT).insert(tokens, {0: good}), ValueError, "got 0"),
        ("state not a tensor", lambda: PrefixCache(block_tokens=BT).insert(tokens, {BT: [1.0]}), ValueError,
         f"checkpoints[{BT}]: expected a floating-point state [HV, K, V], got list"),
        ("state 4-D", lambda: PrefixCache(block_tokens=BT).insert(tokens, {BT: good[None]}), ValueError,
         f"checkpoints[{BT}]: expected a floating-point state [HV, K, V], got a float32 tensor of shape (1, 2, 3, 3)"),
        ("states differ", lambda: PrefixCache(block_tokens=BT).insert(tokens, {BT: good, 2 * BT: good[:1]}), ValueError,
         f"checkpoints[{2 * BT}]: expected a float32 tensor of shape (2, 3, 3) on cpu like the other positions"),
        ("shape vs earlier", lambda: inserted_cache().insert(prompt(BT), {BT: torch.randn(2, 3, 4)}), ValueError,
         "checkpoints: expected states of shape (2, 3, 3) float32 on cpu as earlier inserts, got shape (2, 3, 4)"),
        ("dtype vs earlier", lambda: inserted_cache().insert(prompt(BT), {BT: good.double()}), ValueError,
         "as earlier inserts, got shape (2, 3, 3) float64 on cpu"),
        ("list vs dict", lambda: inserted_cache().insert(prompt(BT), [{BT: good}]), TypeError,
         "checkpoints: expected one dict (one layer) as earlier inserts, got a list of dicts"),
        ("layers' positions", lambda: PrefixCache(block_tokens=BT).insert(tokens, [{BT: good}, {2 * BT: good}]), ValueError,
         f"checkpoints[1]: expected the positions of checkpoints[0] [{BT}], got [{2 * BT}]"),
        ("no layers", lambda: PrefixCache(block_tokens=BT).insert(tokens, []), ValueError, "checkpoints: expected one dict per layer"),
        ("checkpoints type", lambda: PrefixCache(block_tokens=BT).insert(tokens, good), TypeError,
         "checkpoints: expected a dict {position: state} or a list of them"),
        ("pages count", lambda: PrefixCache(block_tokens=BT).insert(tokens, pages=[1]), ValueError,
         "pages: expected one entry per full block of token_ids (2), got 1"),
        ("pages type", lambda: PrefixCache(block_tokens=BT).insert(tokens, pages=7), TypeError,
         "pages: expected None or a list with one entry per full block, got int"),
        ("release twice", lambda: (lambda c, h: c.release(h))(*released_hit()), ValueError,
         "hit: expected a live hit of this cache, got one already released"),
        ("release elsewhere", lambda: PrefixCache().release(PrefixCache().lookup([1])), ValueError,
         "hit: expected a live hit of this cache"),
        ("release not a hit", lambda: PrefixCache().release("hit"), TypeError, "hit: expected a PrefixHit from lookup, got str"),
        ("evict blocks", lambda: PrefixCache().evict(blocks=-1), ValueError, "blocks: expected a non-negative integer, got -1"),
        ("evict bytes", lambda: PrefixCache().evict(checkpoint_bytes=1.5), ValueError, "checkpoint_bytes: expected a non-negative"),
        ("split count", lambda: split_checkpoints(torch.randn(4, *SHAPE), 2, torch.tensor([0, 4, 7])), ValueError,
         "checkpoints: expected 3 states"),
        ("split start", lambda: split_checkpoints(torch.randn(2, 1, *SHAPE), 2, start=[0]), ValueError,
         "start: expected one position per sequence (2), got 1"),
        ("split every", lambda: split_checkpoints(torch.randn(2, 1, *SHAPE), 0), ValueError, "every: expected a positive"),
    ]


@pytest.mark.parametrize("case", bad_cases(), ids=lambda case: case[0])
def test_bad_input_is_rejected_naming_the_argument(case):
    _, call, error, message = case
    with pytest.raises(error) as info:
        call()
    text = str(info.value)
    assert message in text, text
    assert one_line(text)


def test_a_rejected_insert_changes_nothing():
    cache = PrefixCache(block_tokens=BT, policy=CheckpointPolicy(every_blocks=1))
    tokens = prompt(3 * BT)
    before = cache.stats()
    with pytest.raises(ValueError):
        cache.insert(tokens, {BT: state_of(tokens[:BT]), 2 * BT: torch.randn(5)})
    assert cache.stats() == before
    cache.insert(tokens[:BT], {BT: state_of(tokens[:BT])})
    with pytest.raises(ValueError):
        cache.insert(tokens, {2 * BT: torch.randn(2, 3, 5)}, pages=["x", "y", "z"])
    assert cache.stats().blocks == 1
    cache.check_invariants()


# --- many threads ---------------------------------------------------------------------------------


def test_concurrent_lookup_insert_release_evict_keep_the_invariants(fresh_seed):
    """8 threads for about 3 s: random lookups (each hit's state is checked against its prefix,
    its pages against those handed back), inserts, releases and evictions over prompts that share
    prefixes, a budget of 6 checkpoints; the cache's invariants checked after every step. At the
    end every page entry ever inserted has come back exactly once."""
    one = nbytes(state_of([]))
    cache = PrefixCache(block_tokens=BT, policy=CheckpointPolicy(every_blocks=2), max_checkpoint_bytes=6 * one)
    trunks = [prompt(length, vocab=3) for length in (0, BT, 2 * BT + 1, 3 * BT)]
    page_ids = itertools.count()
    handed_back: set[int] = set()
    inserted_pages: set[int] = set()
    ledger = threading.Lock()  # guards the two sets above
    failures: list[BaseException] = []
    deadline = time.monotonic() + 3.0
    steps = [0]

    def give_back(pages, where):
        with ledger:
            again = handed_back.intersection(pages)
            assert not again, f"{where}: pages {sorted(again)} handed back twice"
            handed_back.update(pages)

    def check_hit(hit: PrefixHit, tokens):
        assert hit.matched_tokens % BT == 0 and hit.matched_tokens <= len(tokens)
        assert hit.state_tokens % BT == 0 and 0 <= hit.state_tokens <= hit.matched_tokens
        assert len(hit.pages) == hit.matched_tokens // BT
        if hit.state_tokens:
            assert torch.equal(hit.state, state_of(tokens[:hit.state_tokens])), "a checkpoint of another prefix"
        else:
            assert hit.state is None
        with ledger:
            assert handed_back.isdisjoint(hit.pages), "a live hit's pages were handed back"

    def worker(seed):
        rng = random.Random(seed)
        held: list[tuple[PrefixHit, list[int]]] = []
        try:
            while time.monotonic() < deadline:
                tokens = rng.choice(trunks) + [rng.randrange(3) for _ in range(rng.randrange(3 * BT))]
                op = rng.random()
                if op < 0.35:
                    hit = cache.lookup(tokens)
                    check_hit(hit, tokens)
                    held.append((hit, tokens))
                elif op < 0.65:
                    # half the time an engine's flow: the hit's pages for what it matched, new
                    # pages for the rest; else new pages for every block (some already cached)
                    with cache.lookup(tokens if rng.random() < 0.5 else []) as hit:
                        check_hit(hit, tokens)
                        fresh = [next(page_ids) for _ in range(len(tokens) // BT - len(hit.pages))]
                        with ledger:
                            inserted_pages.update(fresh)
                        inserted = cache.insert(tokens, all_checkpoints(tokens), pages=[*hit.pages, *fresh])
                    give_back(inserted.unused_pages, "insert")
                elif op < 0.9 and held:
                    hit, tokens = held.pop(rng.randrange(len(held)))
                    check_hit(hit, tokens)  # still valid: nothing it pinned was evicted
                    cache.release(hit)
                else:
                    evicted = cache.evict(blocks=rng.randrange(4), checkpoint_bytes=rng.randrange(3) * one)
                    give_back(evicted.pages, "evict")
                cache.check_invariants()
                steps[0] += 1
            for hit, tokens in held:
                check_hit(hit, tokens)
                cache.release(hit)
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            failures.append(error)

    threads = [threading.Thread(target=worker, args=(fresh_seed + i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, repr(failures[0])
    cache.check_invariants()
    stats = cache.stats()
    assert stats.live_hits == 0 and stats.lookups > 50 and stats.hits > 0 and stats.evicted_blocks > 0, stats
    give_back(cache.evict(blocks=stats.blocks).pages, "final evict")
    assert cache.stats().blocks == 0 and cache.stats().checkpoint_bytes == 0
    assert handed_back == inserted_pages, "every page entry comes back exactly once"
    print(f"{steps[0]} steps, {stats}")


# --- the kernel path of a hit ----------------------------------------------------------------------

KERNEL_BT = 32  # block_tokens of the kernel tests: two 16-token chunks
CHUNK_PIPELINE = "lower-recurrent,derive-chunkwise,fuse-chunkwise"


def chunk_layer(compile_layer, kind):
    return compile_layer(pipeline=CHUNK_PIPELINE, **recurrence_table(kind, H=2, K=16, V=16, name=f"prefix_{kind}"))


def continue_prompt(inputs: dict, shared: int, extra: int, kind: str) -> dict:
    """Layer inputs of a prompt sharing `shared` tokens with `inputs`' prompt, then `extra` new
    ones: a causal model gives the shared tokens the same q, k, v, g, beta."""
    fresh = recurrence_inputs(kind, "kv", RecurrenceShape(1, extra, 2, 2, 16, 16), initial_state=False)
    return {name: torch.cat([inputs[name][:, :shared], fresh[name]], dim=1) for name in fresh}


def varlen(prompts: list[dict], starts: list[int]) -> dict:
    """The token inputs of several prompts from `starts` on, as one varlen batch."""
    batch = {name: torch.cat([p[name][:, s:] for p, s in zip(prompts, starts)], dim=1) for name in prompts[0]}
    lengths = [p["q"].shape[1] - s for p, s in zip(prompts, starts)]
    batch["cu_seqlens"] = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int64)
    return batch


def assert_close(out, ref, what):
    assert_matches(out, ref.double(), what, rms_tol=1e-6, atol=1e-5, rtol=1e-5)


def test_kda_resumes_from_a_hit_like_a_full_prefill(compile_layer):
    """Prompt A (5 blocks) is prefilled and inserted (checkpoints every 2 blocks and at its end);
    prompt B shares 3.5 blocks: it matches 3, resumes from the checkpoint at 2 and recomputes one
    block. The resumed outputs and final state equal B's full prefill; B's own checkpoints from
    the resumed run, inserted, give the state at its end as the full prefill has it."""
    layer = chunk_layer(compile_layer, "kda")
    cache = PrefixCache(block_tokens=KERNEL_BT, policy=CheckpointPolicy(every_blocks=2))
    tokens_a = prompt(5 * KERNEL_BT)
    inputs_a = recurrence_inputs("kda", "kv", RecurrenceShape(1, 5 * KERNEL_BT, 2, 2, 16, 16), initial_state=False)
    _, _, kept_a = layer.chunk(**inputs_a, output_final_state=True, checkpoint_every=KERNEL_BT)
    (checkpoints_a,) = split_checkpoints(kept_a, KERNEL_BT)
    assert cache.insert(tokens_a, checkpoints_a).checkpoint_positions == (64, 128, 160)

    shared = 3 * KERNEL_BT + 16
    tokens_b = tokens_a[:shared] + prompt(2 * KERNEL_BT - 16)
    inputs_b = continue_prompt(inputs_a, shared, len(tokens_b) - shared, "kda")
    full_o, full_final, full_kept = layer.chunk(**inputs_b, output_final_state=True, checkpoint_every=KERNEL_BT)

    with cache.lookup(tokens_b) as hit:
        assert (hit.matched_tokens, hit.state_tokens, hit.recompute_tokens) == (96, 64, 32)
        start = hit.state_tokens
        suffix = {name: x[:, start:] for name, x in inputs_b.items()}
        o, final, kept = layer.chunk(**suffix, initial_state=hit.state[None], output_final_state=True,
                                     checkpoint_every=KERNEL_BT)
    assert_close(o[:, hit.matched_tokens - start:], full_o[:, hit.matched_tokens:], "o after matched_tokens")
    assert_close(o, full_o[:, start:], "o from the checkpoint on")
    assert_close(final, full_final, "final state")

    (checkpoints_b,) = split_checkpoints(kept, KERNEL_BT, start=start)
    assert sorted(checkpoints_b) == [96, 128, 160]
    assert cache.insert(tokens_b, checkpoints_b).checkpoint_positions == (128, 160)
    with cache.lookup(tokens_b) as again:
        assert (again.matched_tokens, again.state_tokens) == (160, 160)
        assert_close(again.state, full_final[0], "B's checkpoint at its end")
    with cache.lookup(tokens_b[:150]) as mid:  # 4 blocks match; B's checkpoint at 128
        assert (mid.matched_tokens, mid.state_tokens) == (128, 128)
        assert_close(mid.state, full_kept[0, 3], "B's checkpoint at 128")


def test_gated_deltanet_varlen_batch_hits_at_different_boundaries(compile_layer):
    """Two prompts prefilled as one varlen batch and inserted; then a varlen batch of three: one
    resumes from a checkpoint in the middle of an inserted prompt (recomputing a block), one from
    the end of the other prompt, one misses. Each resumed sequence equals a full varlen prefill."""
    layer = chunk_layer(compile_layer, "gated_deltanet")
    cache = PrefixCache(block_tokens=KERNEL_BT, policy=CheckpointPolicy(every_blocks=2))
    lengths = [150, 100]  # 4 and 3 full blocks: checkpoints at 64, 128 and at 64, 96
    shape = RecurrenceShape(1, sum(lengths), 2, 2, 16, 16, seqlens=tuple(lengths))
    batch = recurrence_inputs("gated_deltanet", "kv", shape, initial_state=False)
    _, _, kept = layer.chunk(**batch, output_final_state=True, checkpoint_every=KERNEL_BT)
    tokens = [prompt(n) for n in lengths]
    offsets = batch.pop("cu_seqlens").tolist()
    inserted = [{name: x[:, begin:end] for name, x in batch.items()} for begin, end in zip(offsets, offsets[1:])]
    for t, checkpoints in zip(tokens, split_checkpoints(kept, KERNEL_BT, torch.tensor(offsets))):
        cache.insert(t, checkpoints)

    # (prompt, shared tokens, new tokens) -> (matched, state_tokens)
    plan = [(0, 110, 60, (96, 64)), (1, 100, 30, (96, 96)), (None, 0, 70, (0, 0))]
    prompts, token_ids = [], []
    for source, shared, extra, _ in plan:
        base = inserted[source] if source is not None else {name: x[:, :0] for name, x in inserted[0].items()}
        prompts.append(continue_prompt(base, shared, extra, "gated_deltanet"))
        token_ids.append((tokens[source][:shared] if source is not None else []) + prompt(extra))
    full_o, full_final = layer.chunk(**varlen(prompts, [0] * len(plan)), output_final_state=True)

    hits = [cache.lookup(t) for t in token_ids]
    assert [(h.matched_tokens, h.state_tokens) for h in hits] == [expected for *_, expected in plan]
    starts = [h.state_tokens for h in hits]
    initial = torch.stack([h.state if h.state is not None else torch.zeros(2, 16, 16) for h in hits])
    o, final = layer.chunk(**varlen(prompts, starts), initial_state=initial, output_final_state=True)
    for hit in hits:
        cache.release(hit)

    full_offsets = [0, *itertools.accumulate(p["q"].shape[1] for p in prompts)]
    resumed = 0
    for n, (hit, begin) in enumerate(zip(hits, full_offsets)):
        length = prompts[n]["q"].shape[1] - hit.state_tokens
        assert_close(o[:, resumed:resumed + length], full_o[:, begin + hit.state_tokens:begin + hit.state_tokens + length],
                     f"sequence {n}: o from its checkpoint on")
        resumed += length
    assert_close(final, full_final, "final states")
    cache.check_invariants()
