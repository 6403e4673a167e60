"""lower-speculative{verify=chunked}: a round's drafts verified as one chunk of the chunkwise
schedule from the committed pool row (prepare kernel + scan kernel, state advance dropped).
Its outputs and cache equal the token verify's within fp32 rounding, the commit after it gives
the same pool state, and spec_step built on it follows the accepted tokens round after round.

Interpreter, fp32, H=2, HV=4, K=24, V=40, block-v 32 (two value blocks, the second partial, as in
test_speculative), draft depth 4 (chunks of 16), every member and both state layouts.
"""

from __future__ import annotations

import re

import pytest
import torch

from conftest import MEMBERS_AND_LAYOUTS, assert_rms, compile_member, recurrence_table
from k3compile.driver import compile as compile_layer
from k3compile.frontend import spec_to_module
from k3compile.ir import reference
from k3compile.spec import spec_from_table
from test_speculative import (BLOCK_V, DEPTH, PIPELINE, advance, assert_spec_step_is_commit_then_verify, drift_rounds,
                             round_inputs, state_shape_of)

CHUNKED = f"derive-replay{{draft-tokens={DEPTH}}},lower-speculative{{block-v={BLOCK_V} verify=chunked}}"
WIDTH = 2 * 24 + 40  # a cache row: k, log-decay, u


@pytest.fixture(scope="module", params=MEMBERS_AND_LAYOUTS, ids=lambda p: f"{p[0]}-{p[1]}")
def layers(request, tmp_path_factory):
    """(the token-verify layer, the chunked-verify layer, the k3.recurrence op)."""
    out = tmp_path_factory.mktemp("chunked_verify")
    token, op = compile_member(*request.param, PIPELINE, out / "token", "token")
    chunked, _ = compile_member(*request.param, CHUNKED, out / "chunked", "chunked")
    return token, chunked, op


def test_the_verify_is_a_prepare_and_a_scan_kernel(layers):
    _, chunked, _ = layers
    source = open(chunked.module.__file__).read()
    for kernel in ("_verify_prepare_kernel", "_verify_kernel", "_spec_step_kernel"):
        assert f"{kernel}(" in source
    # spec_step's prepare is the verify's (merge-identical-kernels): launched, not printed twice
    assert "_spec_step_prepare_kernel" not in source
    spec_step = source[source.index("\ndef spec_step("):]
    assert "_verify_prepare_kernel[grid](" in spec_step
    verify_kernels = source[:source.index("\ndef verify(")]
    assert "for t in range(bos, eos)" not in verify_kernels, "the verify kernels run no token loop"


def test_bf16_inputs_keep_fp32_products(layers, fresh_seed):
    """The chunked verify's kernels multiply in fp32 (dots = fp32) and spill fp32 workspaces
    whatever the inputs: with bf16 q, k, v, beta its cache (the committed state's updates) stays
    at fp32 rounding of the token verify's, not bf16's."""
    token, chunked, op = layers
    gen = torch.Generator().manual_seed(fresh_seed)
    pool = torch.randn((3, *state_shape_of(op)), generator=gen)
    slots = torch.tensor([2, 0])
    inputs = {k: v.to(torch.bfloat16) if k in ("q", "k", "v", "beta") and v is not None else v
              for k, v in round_inputs(op, 2, gen).items()}
    want_cache, cache = torch.zeros((3, DEPTH, 4, WIDTH)), torch.zeros((3, DEPTH, 4, WIDTH))
    (want_o,) = token.verify(**inputs, state=pool, state_indices=slots, cache=want_cache)
    (o,) = chunked.verify(**inputs, state=pool, state_indices=slots, cache=cache)
    assert_rms(o.float(), want_o.double(), "bf16 o", 1e-2)  # both rounded to bf16 once
    assert_rms(cache, want_cache.double(), "bf16-input cache", 1e-5)


def test_rounds_of_chunked_verify_and_commit_follow_the_accepted_tokens(layers, fresh_seed):
    """A round of one token (the rest of its chunk padding), then one of DEPTH tokens from the
    states the first committed. Each chunked verify's o and cache are within fp32 rounding of
    the token verify's (which caches u token by token) and o of the float64 recurrence; the pool
    is only read; the cache rows past the round's tokens, padding (-1) and unused slots' rows
    stay bit-identical (NaN). The commit after it (accept counts none, all, partial, all: mixed
    in each batch) gives the float64 state over the accepted tokens and the pool state the commit
    after the token verify gives."""
    token, chunked, op = layers
    gen = torch.Generator().manual_seed(fresh_seed)
    pool = torch.randn((5, *state_shape_of(op)), generator=gen)
    token_pool = pool.clone()
    cache, token_cache = (torch.full((5, DEPTH, 4, WIDTH), float("nan")) for _ in range(2))
    slots, used, unused = torch.tensor([4, -1, 1]), [4, 1], [0, 2, 3]
    # slot 4 accepts none then 2, slot 1 its one token then all (the padding's counts are never read)
    for tokens, accepted in ((1, [0, 3, 1]), (DEPTH, [2, 0, DEPTH])):
        inputs = round_inputs(op, 3, gen, tokens=tokens)
        before = pool.clone()
        starts = torch.stack([before[i] if i >= 0 else torch.zeros(state_shape_of(op)) for i in slots.tolist()])
        (o,) = chunked.verify(**inputs, state=pool, state_indices=slots, cache=cache)
        assert torch.equal(pool, before), "verify must not write the committed state"
        assert_rms(o, reference.recurrence(op, **inputs, initial_state=starts)[0], "chunked verify o", 1e-5)
        (want_o,) = token.verify(**inputs, state=token_pool, state_indices=slots, cache=token_cache)
        assert_rms(o, want_o.double(), f"chunked vs token verify o ({tokens} tokens)", 1e-5)
        assert_rms(cache[used, :tokens], token_cache[used, :tokens].double(), "chunked verify cache", 1e-5)
        torch.testing.assert_close(cache[used, tokens:], token_cache[used, tokens:], rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(cache[unused], token_cache[unused], rtol=0, atol=0, equal_nan=True)
        chunked.commit(state=pool, state_indices=slots, cache=cache, accepted=torch.tensor(accepted))
        token.commit(state=token_pool, state_indices=slots, cache=token_cache, accepted=torch.tensor(accepted))
        for b, (slot, m) in enumerate(zip(slots.tolist(), accepted)):
            if slot >= 0:
                want = advance(op, before[slot:slot + 1].double(), inputs, b, m)
                assert_rms(pool[slot:slot + 1], want, f"slot {slot} after {m} accepted", 1e-5)
        assert_rms(pool, token_pool.double(), "pool after the chunked vs the token verify", 1e-5)
        assert torch.equal(pool[unused], before[unused])


def test_chunked_spec_step_rounds_follow_the_accepted_tokens(layers, fresh_seed):
    """spec_step with the chunked verify half: each launch replays the previous round's accepted
    prefix, writes the row, verifies the new round as one chunk from it into next_cache; against
    the float64 chain over the accepted tokens, and against the token spec_step."""
    token, chunked, op = layers
    gen = torch.Generator().manual_seed(fresh_seed)
    pool_rows, batch = 6, 4
    pool = torch.randn((pool_rows, *state_shape_of(op)), generator=gen)
    token_pool = pool.clone()
    caches = torch.full((2, pool_rows, DEPTH, 4, WIDTH), float("nan"))
    token_caches = caches.clone()
    slots = torch.tensor([4, -1, 1, 2])
    exact = {s: pool[s:s + 1].double() for s in slots.tolist() if s >= 0}
    unused = [0, 3, 5]
    before_unused = pool[unused].clone()
    accepted = torch.zeros(batch, dtype=torch.int64)
    # two launches (the first commits nothing, the second commits partial, all and none from the
    # cache the first wrote, into the other cache) and the last commit (all, 1, 2)
    for round_, verdict in enumerate(([2, 3, DEPTH, 0], [DEPTH, 0, 1, 2])):
        cache, next_cache = caches[round_ % 2], caches[1 - round_ % 2]
        inputs = round_inputs(op, batch, gen)
        starts = torch.cat([exact[s] if s >= 0 else torch.zeros((1, *state_shape_of(op)), dtype=torch.float64)
                            for s in slots.tolist()])
        (o,) = chunked.spec_step(**inputs, state=pool, state_indices=slots, cache=cache, accepted=accepted,
                                 next_cache=next_cache)
        (want_o,) = token.spec_step(**inputs, state=token_pool, state_indices=slots,
                                    cache=token_caches[round_ % 2], accepted=accepted,
                                    next_cache=token_caches[1 - round_ % 2])
        assert_rms(o, reference.recurrence(op, **inputs, initial_state=starts)[0], "chunked spec_step o", 1e-5)
        assert_rms(o, want_o.double(), "chunked vs token spec_step o", 1e-5)
        for s, want in exact.items():
            assert_rms(pool[s:s + 1], want, f"slot {s} committed by spec_step", 1e-5)
        assert torch.equal(pool[unused], before_unused)
        torch.testing.assert_close(caches[:, unused], token_caches[:, unused], rtol=0, atol=0, equal_nan=True)
        accepted = torch.tensor(verdict)
        for b, s in enumerate(slots.tolist()):
            if s >= 0:
                exact[s] = advance(op, exact[s], inputs, b, verdict[b])
    chunked.commit(state=pool, state_indices=slots, cache=next_cache, accepted=accepted)
    for s, want in exact.items():
        assert_rms(pool[s:s + 1], want, f"slot {s} after the last commit", 1e-5)
    assert torch.equal(pool[unused], before_unused)


@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.bfloat16], ids=["fp32_pool", "bf16_pool"])
def test_chunked_spec_step_is_commit_then_chunked_verify(layers, pool_dtype, fresh_seed):
    """The fused entry gives what commit followed by the chunked verify gives (bit for bit: the
    same stages on the same state, with a bf16 pool the state as the pool holds it)."""
    _, chunked, op = layers
    assert_spec_step_is_commit_then_verify(chunked, op, pool_dtype, fresh_seed, width=WIDTH)


def test_chunked_slots_outside_the_pool_touch_no_memory(layers, fresh_seed):
    """Padding (-1) and slots past the pool (the host's check off) read no cache or pool row and
    write none."""
    _, chunked, op = layers
    gen = torch.Generator().manual_seed(fresh_seed)
    guarded = torch.randn((5, *state_shape_of(op)), generator=gen)  # the pool is rows 1, 2
    caches = torch.randn((2, 5, DEPTH, 4, WIDTH), generator=gen)
    guarded[[0, 3, 4]] = caches[:, [0, 3, 4]] = float("nan")
    before = guarded.clone(), caches.clone()
    slots, accepted = torch.tensor([-1, 3]), torch.tensor([DEPTH, DEPTH])
    (o,) = chunked.verify(**round_inputs(op, 2, gen), state=guarded[1:3], state_indices=slots, cache=caches[0, 1:3],
                          check_indices=False)
    assert torch.isfinite(o).all()
    (o,) = chunked.spec_step(**round_inputs(op, 2, gen), state=guarded[1:3], state_indices=slots,
                             cache=caches[0, 1:3], accepted=accepted, next_cache=caches[1, 1:3], check_indices=False)
    assert torch.isfinite(o).all()
    for now, then in zip((guarded, caches), before):
        torch.testing.assert_close(now, then, rtol=0, atol=0, equal_nan=True)


def test_chunked_refuses_more_tokens_than_the_cache_holds(layers, fresh_seed):
    _, chunked, op = layers
    inputs = round_inputs(op, 1, torch.Generator().manual_seed(fresh_seed), tokens=DEPTH + 1)
    with pytest.raises(ValueError, match="at most 4 tokens"):
        chunked.verify(**inputs, state=torch.zeros((1, *state_shape_of(op))), state_indices=torch.tensor([0]),
                       cache=torch.zeros((1, DEPTH, 4, WIDTH)))


@pytest.mark.parametrize("fused", [False, True], ids=["verify_commit", "spec_step"])
def test_fifty_chunked_rounds_do_not_drift(tmp_path_factory, fused, fresh_seed):
    """50 rounds with random acceptance through the chunked verify (apart, or in spec_step) stay
    at fp32 rounding of the float64 recurrence over the accepted tokens."""
    drift_rounds(tmp_path_factory, CHUNKED, fused, fresh_seed)


@pytest.mark.parametrize("fused", [False, True], ids=["verify_commit", "spec_step"])
def test_tf32x3_products_do_not_drift(tmp_path_factory, fused, fresh_seed):
    """verify-dots=tf32x3: every product of the chunked verify (prepare and scan, the triangular
    inverse too) through three tf32 products; rounds stay at fp32 rounding all the same. Triton's
    interpreter takes every tl.dot in fp32 whatever its input_precision, the arithmetic of
    test_fifty_chunked_rounds_do_not_drift: 10 rounds (every accept count among them) rather than
    its 50; the launches' DOT below is what differs."""
    pipeline = CHUNKED.replace("verify=chunked", "verify=chunked verify-dots=tf32x3")
    source = drift_rounds(tmp_path_factory, pipeline, fused, fresh_seed, rounds=10).path.read_text()
    # the four chunked-verify kernels (verify's and spec_step's prepare and scan) launch with
    # DOT = tf32x3, which every product helper (_mm, _mm_accurate) then uses
    launches = re.findall(r"DOT=([^,\n]+),", source)
    assert launches == ["'tf32x3'"] * 4, launches


@pytest.mark.parametrize("depth", [8, 20])
def test_deeper_rounds_round_up_to_a_chunk(tmp_path, depth, fresh_seed):
    """n = 8 verifies as a chunk of 16, n = 20 as one of 32: the same outputs and cache as the
    token verify."""
    spec = spec_from_table(recurrence_table("gated_deltanet", "vk", H=1, HV=2, K=16, V=16, name=f"deep{depth}"))
    token = compile_layer(spec, out_dir=tmp_path / "t", pipeline=f"derive-replay{{draft-tokens={depth}}},lower-speculative")
    chunked = compile_layer(spec, out_dir=tmp_path / "c",
                            pipeline=f"derive-replay{{draft-tokens={depth}}},lower-speculative{{verify=chunked}}")
    assert f"BC = {16 if depth <= 16 else 32}" in open(chunked.module.__file__).read()
    op = next(iter(spec_to_module(spec).ops))
    gen = torch.Generator().manual_seed(fresh_seed)
    pool = torch.randn((3, 2, 16, 16), generator=gen)
    slots = torch.tensor([2, 0])
    inputs = round_inputs(op, 2, gen, tokens=depth)
    want_cache, cache = torch.zeros((3, depth, 2, 48)), torch.zeros((3, depth, 2, 48))
    (want_o,) = token.verify(**inputs, state=pool, state_indices=slots, cache=want_cache)
    (o,) = chunked.verify(**inputs, state=pool, state_indices=slots, cache=cache)
    assert_rms(o, want_o.double(), "o", 1e-5)
    assert_rms(cache, want_cache.double(), "cache", 1e-5)


def test_chunked_verify_options_are_checked(tmp_path):
    from k3compile.errors import K3Error

    spec = spec_from_table(recurrence_table("kda", "kv", H=1, HV=1, K=16, V=16, name="opts"))
    for options, message in (("verify=chunks", "verify must be token or chunked"),
                             ("verify=chunked mode=snapshot", "needs mode=replay"),
                             ("verify=chunked verify-dots=bf16", "verify-dots must be fp32 or tf32x3"),
                             ("verify-dots=tf32x3", "verify-dots applies to verify=chunked")):
        with pytest.raises((ValueError, K3Error), match=message):
            compile_layer(spec, out_dir=tmp_path, pipeline=f"derive-replay,lower-speculative{{{options}}}")
    with pytest.raises((ValueError, K3Error), match="draft-tokens <= 64"):
        compile_layer(spec, out_dir=tmp_path,
                      pipeline="derive-replay{draft-tokens=65},lower-speculative{verify=chunked}")
