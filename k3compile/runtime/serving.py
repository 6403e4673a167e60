"""Hybrid prefix cache: reuse a prompt's prefix at any block boundary with sparse KDA checkpoints.

In a hybrid model attention's KV cache grows with the prefix while a KDA layer's state is a
fixed [HV, K, V] matrix per layer. `PrefixCache` decouples the two (docs/prefix-cache.md):

- prompts are hashed in blocks of `block_tokens` (default 512) tokens with chained hashes
  (blake2b of the previous block's digest and this block's token ids), so a block's digest names
  its whole prefix and a cached block is reachable only through its cached parent;
- attention pages stay the engine's: each block records an opaque page entry (a page id, a
  tuple of them: any value compared with ==) that `insert` is given and `evict` hands back;
- KDA state checkpoints are kept only where the `CheckpointPolicy` says (every n-th block end
  and the end of every inserted prompt), within a byte budget with LRU eviction;
- `lookup` matches the hash chain, then resumes from the latest checkpoint at or before the
  match: `state_tokens <= matched_tokens`, and the tokens between are recomputed.

Semantics where the issue is silent:

- Only full blocks are cached or matched: a prompt's last partial block is ignored. To keep
  one token to compute (its logits), look up `token_ids[:-1]`.
- `matched_tokens` is how far the attention pages can be reused, `state_tokens` where the KDA
  state resumes. The engine runs the model from `state_tokens` on (every layer: attention
  reads, but need not write, the pages of the recomputed blocks), so compute is saved on
  `state_tokens` tokens and page memory on `matched_tokens`.
- Every `lookup` returns a hit, a miss included (`matched_tokens == 0`), and every hit pins what
  it returned (its blocks and the checkpoint it resumes from) until `release(hit)` or the end
  of a `with cache.lookup(...) as hit:` block. Releasing a hit twice is a ValueError.
- `hit.state` is the cache's own copy, shared by concurrent hits: read it (as `initial_state`),
  never write it. It is one tensor when inserts gave one layer's dict, a tuple with one tensor
  per layer when they gave a list of dicts; the first insert with checkpoints fixes the form,
  and each layer's shape, dtype and device.
- `insert` copies the checkpoints the policy keeps (the chunk entry's output is a view of one
  large tensor), and keeps the existing checkpoint or page entry of a block already cached. For
  such a block the caller passes the entry its hit returned (then nothing comes back) or pages
  of its own, which come back in `Inserted.unused_pages` for it to free. Insert before releasing
  the hit whose entries it passes: once released, its blocks may be evicted and their pages
  handed back.
- Checkpoints are evicted by the byte budget (at every insert and release) and by
  `evict(checkpoint_bytes=n)`, least recently used first; blocks only by `evict(blocks=n)`,
  which returns their page entries, least recently used leaves first (a block with cached
  children is never evicted: it is their prefix), each taking its checkpoint with it. The
  engine's KV allocator decides when pages are short; the cache never frees one on its own.
- `split_checkpoints` turns a compiled chunk entry's `checkpoints` output (rows or varlen) into
  the {position: state} dicts `insert` takes, positions counted from each prompt's start.
- Hash collisions (two prefixes with one 128-bit digest) are not guarded against.

Concurrency: one lock guards all state; hashing token ids happens outside it. Invariants, held
whenever the lock is free (`check_invariants` verifies them):

1. prefix-closed: every cached block's parent block is cached, and `children` counts its
   cached child blocks;
2. pins: a block's `pins` is the number of live hits that matched it, a checkpoint's
   `checkpoint_pins` the number resuming from it; a hit pins every block it matched, so every
   block under (before) a pinned one is pinned too. Eviction never takes a pinned block, a
   block with children, or a pinned checkpoint, so a live hit's pages and state stay valid;
3. budget: `checkpoint_bytes` is the sum of the held checkpoints' sizes, and at most
   `max_checkpoint_bytes` unless every held checkpoint is pinned;
4. every page entry is handed back to the caller exactly once: by `evict` for a block that was
   cached, or at once in `Inserted.unused_pages` when its block already was under another entry.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import numbers
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

DIGEST_BYTES = 16  # 128-bit chained digests: collisions negligible at any cache size


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ValueError(f"{name}: expected a positive integer, got {value!r}")
    return int(value)


def _count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{name}: expected a non-negative integer, got {value!r}")
    return int(value)


def _offsets(name: str, offsets: Any) -> list[int]:
    """A chunk entry's varlen offsets (the checks its own entry makes): 1-D int32 or int64, at
    least one sequence, from 0, non-decreasing."""
    if not isinstance(offsets, torch.Tensor) or offsets.ndim != 1 or offsets.dtype not in (torch.int32, torch.int64) \
            or offsets.numel() < 2:
        raise ValueError(f"{name}: expected a 1-D int32 or int64 tensor of N + 1 >= 2 offsets, "
                         f"got {_describe(offsets)}")
    bounds = offsets.tolist()
    if bounds[0] != 0 or any(end < begin for begin, end in zip(bounds, bounds[1:])):
        raise ValueError(f"{name}: expected non-decreasing offsets from 0, got {bounds}")
    return bounds


def _describe(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"a {str(x.dtype).removeprefix('torch.')} tensor of shape {tuple(x.shape)} on {x.device}"
    return type(x).__name__


@dataclass(frozen=True)
class CheckpointPolicy:
    """Which block ends of an inserted prompt keep a KDA state checkpoint: every `every_blocks`-th
    (positions every_blocks * block_tokens, 2 * every_blocks * block_tokens, ...), bounding a
    hit's recompute to every_blocks - 1 blocks, and with `at_prompt_end` the end of the prompt's
    last full block, so the same prompt again (the next turn of a chat) recomputes nothing."""

    every_blocks: int = 4
    at_prompt_end: bool = True

    def __post_init__(self) -> None:
        _positive_int("every_blocks", self.every_blocks)
        if not isinstance(self.at_prompt_end, bool):
            raise TypeError(f"at_prompt_end: expected True or False, got {self.at_prompt_end!r}")

    def keeps(self, block: int, prompt_blocks: int) -> bool:
        """Whether the state after `block` full blocks of a prompt of `prompt_blocks` is kept."""
        return block % self.every_blocks == 0 or (self.at_prompt_end and block == prompt_blocks)


class _Block:
    """One cached block: the prefix named by `key` (its chained digest), ending at `end` tokens."""

    __slots__ = ("key", "parent", "end", "pages", "children", "pins", "used", "checkpoint", "checkpoint_pins",
                 "checkpoint_bytes")

    def __init__(self, key: bytes, parent: _Block | None, end: int, pages: Any) -> None:
        self.key, self.parent, self.end, self.pages = key, parent, end, pages
        self.children = 0
        self.pins = 0
        self.used = 0  # tick of the last lookup or insert that touched it (LRU among blocks)
        self.checkpoint: tuple[torch.Tensor, ...] | None = None  # one state per layer
        self.checkpoint_pins = 0
        self.checkpoint_bytes = 0


@dataclass(frozen=True, eq=False)
class PrefixHit:
    """What `PrefixCache.lookup` found; pins its blocks and checkpoint until released.

    matched_tokens: the cached prefix (a multiple of block_tokens): attention pages to reuse.
    state_tokens: where `state` lies (<= matched_tokens; 0 without one).
    state: the KDA state after state_tokens tokens ([HV, K, V] as the layer lays it out, or a
        tuple with one per layer), None without a checkpoint; read-only.
    pages: the page entry of each matched block, in order.
    """

    matched_tokens: int
    state_tokens: int
    state: torch.Tensor | tuple[torch.Tensor, ...] | None = field(repr=False)
    pages: tuple = field(repr=False)
    _cache: PrefixCache = field(repr=False)

    @property
    def recompute_tokens(self) -> int:
        """Tokens to run again from the checkpoint to rebuild the state at matched_tokens."""
        return self.matched_tokens - self.state_tokens

    def __enter__(self) -> PrefixHit:
        return self

    def __exit__(self, *exc_info) -> None:
        self._cache.release(self)


@dataclass(frozen=True)
class Inserted:
    """What `PrefixCache.insert` did: blocks added, checkpoint positions stored, and the caller's
    page entries of blocks that were already cached under other entries (the cache keeps its
    own; free these)."""

    new_blocks: int
    checkpoint_positions: tuple[int, ...]
    unused_pages: tuple


@dataclass(frozen=True)
class Eviction:
    """What `PrefixCache.evict` freed: the page entries of the evicted blocks (now the caller's to
    free), how many blocks and checkpoints went, and the checkpoint bytes released."""

    pages: tuple
    blocks: int
    checkpoints: int
    checkpoint_bytes: int


@dataclass(frozen=True)
class PrefixCacheStats:
    """Counters since the cache was made, and what it holds now.

    hits: lookups that matched at least one block. tokens_matched: the sum of matched_tokens
    (attention prefix reused); tokens_resumed: of state_tokens (tokens not computed again);
    tokens_recomputed: of recompute_tokens.
    """

    lookups: int
    hits: int
    tokens_matched: int
    tokens_resumed: int
    tokens_recomputed: int
    blocks: int
    checkpoints: int
    checkpoint_bytes: int
    live_hits: int
    evicted_blocks: int
    evicted_checkpoints: int


def token_bytes(token_ids: Any) -> bytes:
    """token_ids (a 1-D integer tensor or a sequence of ints, each in 0..2**63-1) as little-endian
    int64 bytes, so a list and a tensor of the same ids hash alike."""
    if isinstance(token_ids, torch.Tensor):
        if token_ids.ndim != 1 or token_ids.dtype.is_floating_point or token_ids.dtype.is_complex \
                or token_ids.dtype == torch.bool:
            raise ValueError(f"token_ids: expected a 1-D integer tensor, got {_describe(token_ids)}")
        ids = token_ids.detach().to("cpu", torch.int64)
    elif isinstance(token_ids, Sequence) and not isinstance(token_ids, (str, bytes)):
        for x in token_ids:
            if isinstance(x, bool) or not isinstance(x, numbers.Integral):
                raise ValueError(f"token_ids: expected integers, got an element {x!r}")
            if x >= 2 ** 63:
                raise ValueError(f"token_ids: expected integers in 0..2**63-1, got {x}")
        ids = torch.tensor([int(x) for x in token_ids], dtype=torch.int64)
    else:
        raise TypeError(f"token_ids: expected a 1-D integer tensor or a sequence of ints, got {_describe(token_ids)}")
    if ids.numel() and int(ids.min()) < 0:
        raise ValueError(f"token_ids: expected non-negative integers, got {int(ids.min())}")
    return ids.numpy().astype("<i8").tobytes()


def block_keys(token_ids: Any, block_tokens: int) -> list[bytes]:
    """The chained digests of token_ids' full blocks: block i's digest hashes block i-1's digest
    and block i's token ids, so it names the whole prefix up to the end of block i."""
    data = token_bytes(token_ids)
    stride = 8 * block_tokens
    keys, previous = [], b""
    for start in range(0, len(data) - stride + 1, stride):
        previous = hashlib.blake2b(previous + data[start:start + stride], digest_size=DIGEST_BYTES).digest()
        keys.append(previous)
    return keys


def split_checkpoints(checkpoints: torch.Tensor, every: int, cu_seqlens: torch.Tensor | None = None,
                      start: int | Sequence[int] = 0) -> list[dict[int, torch.Tensor]]:
    """The `checkpoints` output of a compiled `chunk(..., checkpoint_every=every)` as one
    {position: state} dict per sequence, ready for `PrefixCache.insert` (views, not copies).

    checkpoints: [N, T // every, *state] (B rows), or [count, *state] with cu_seqlens (varlen).
    start: where each sequence's first token lies in its prompt (one int for all, or one per
        sequence): the hit's state_tokens when the call resumed from a checkpoint.
    """
    if not isinstance(checkpoints, torch.Tensor):
        raise TypeError(f"checkpoints: expected the chunk entry's checkpoints tensor, got {_describe(checkpoints)}")
    every = _positive_int("every", every)
    if cu_seqlens is None:
        if checkpoints.ndim < 2:
            raise ValueError(f"checkpoints: expected [N, T // every, *state], got {_describe(checkpoints)}")
        per_sequence = [checkpoints[n] for n in range(checkpoints.shape[0])]
    else:
        bounds = _offsets("cu_seqlens", cu_seqlens)
        counts = [(end - begin) // every for begin, end in zip(bounds, bounds[1:])]
        if checkpoints.ndim < 1 or checkpoints.shape[0] != sum(counts):
            raise ValueError(f"checkpoints: expected {sum(counts)} states (the sequences of cu_seqlens every "
                             f"{every} tokens), got {_describe(checkpoints)}")
        firsts = list(itertools.accumulate(counts, initial=0))
        per_sequence = [checkpoints[first:first + count] for first, count in zip(firsts, counts)]
    starts = [start] * len(per_sequence) if isinstance(start, numbers.Integral) else list(start)
    if len(starts) != len(per_sequence):
        raise ValueError(f"start: expected one position per sequence ({len(per_sequence)}), got {len(starts)}")
    for position in starts:
        _count("start", position)
    return [{int(begin) + (j + 1) * every: states[j] for j in range(states.shape[0])}
            for begin, states in zip(starts, per_sequence)]


class PrefixCache:
    """Chained-hash prefix blocks with attention page entries and sparse KDA checkpoints.

    block_tokens: tokens per hashed block (512; any positive size, e.g. small ones in tests).
    policy: which block ends keep a checkpoint (CheckpointPolicy()).
    max_checkpoint_bytes: the byte budget of the held checkpoints (None: no limit).
    """

    def __init__(self, block_tokens: int = 512, policy: CheckpointPolicy | None = None,
                 max_checkpoint_bytes: int | None = None) -> None:
        self.block_tokens = _positive_int("block_tokens", block_tokens)
        if policy is not None and not isinstance(policy, CheckpointPolicy):
            raise TypeError(f"policy: expected a CheckpointPolicy, got {_describe(policy)}")
        self.policy = policy or CheckpointPolicy()
        self.max_checkpoint_bytes = None if max_checkpoint_bytes is None else _count("max_checkpoint_bytes",
                                                                                     max_checkpoint_bytes)
        self._lock = threading.Lock()
        self._blocks: dict[bytes, _Block] = {}
        self._checkpoints: OrderedDict[bytes, _Block] = OrderedDict()  # least recently used first
        self._checkpoint_bytes = 0
        self._live: dict[PrefixHit, tuple[list[_Block], _Block | None]] = {}  # keyed by identity
        self._ticks = itertools.count(1)
        self._per_layer: bool | None = None  # lists of dicts (True) or one dict (False); None: not yet
        self._layer_forms: tuple[tuple, ...] | None = None  # (shape, dtype, device) of each layer
        self._counters = dict(lookups=0, hits=0, tokens_matched=0, tokens_resumed=0, tokens_recomputed=0,
                              evicted_blocks=0, evicted_checkpoints=0)

    # --- public methods -------------------------------------------------------------------------

    def lookup(self, token_ids: Any) -> PrefixHit:
        """The longest cached prefix of token_ids (whole blocks) and the latest checkpoint within
        it; pins both until `release(hit)`."""
        keys = block_keys(token_ids, self.block_tokens)
        with self._lock:
            matched = []
            for key in keys:
                block = self._blocks.get(key)
                if block is None:
                    break
                matched.append(block)
            resume = next((b for b in reversed(matched) if b.checkpoint is not None), None)
            for block in matched:
                block.pins += 1
                block.used = next(self._ticks)
            state = None
            if resume is not None:
                resume.checkpoint_pins += 1
                self._checkpoints.move_to_end(resume.key)
                state = resume.checkpoint if self._per_layer else resume.checkpoint[0]
            hit = PrefixHit(matched_tokens=len(matched) * self.block_tokens,
                            state_tokens=resume.end if resume else 0, state=state,
                            pages=tuple(b.pages for b in matched), _cache=self)
            self._live[hit] = (matched, resume)
            counters = self._counters
            counters["lookups"] += 1
            counters["hits"] += bool(matched)
            counters["tokens_matched"] += hit.matched_tokens
            counters["tokens_resumed"] += hit.state_tokens
            counters["tokens_recomputed"] += hit.recompute_tokens
        return hit

    def release(self, hit: PrefixHit) -> None:
        """Unpin what `hit` returned (once per hit); the byte budget then applies to its checkpoint."""
        if not isinstance(hit, PrefixHit):
            raise TypeError(f"hit: expected a PrefixHit from lookup, got {_describe(hit)}")
        with self._lock:
            pinned = self._live.pop(hit, None)
            if pinned is None:
                raise ValueError("hit: expected a live hit of this cache, got one already released (or from "
                                 "another cache)")
            matched, resume = pinned
            for block in matched:
                block.pins -= 1
            if resume is not None:
                resume.checkpoint_pins -= 1
            self._enforce_budget()

    def insert(self, token_ids: Any, checkpoints: Mapping | Sequence[Mapping] | None = None,
               pages: Sequence | None = None) -> Inserted:
        """Cache token_ids' full blocks and the checkpoints the policy keeps.

        checkpoints: {position: state} with positions multiples of block_tokens in
            block_tokens..(full blocks) * block_tokens, as `split_checkpoints` gives a compiled
            chunk entry's output (one layer), or a list of such dicts with the same positions
            (one per layer); None or {} for none.
        pages: None, or one opaque page entry per full block, in order; for a block already
            cached, its cached entry (as a hit returned it) or one that comes back as unused.
        Validates everything before changing anything: a bad insert leaves the cache as it was.
        """
        keys = block_keys(token_ids, self.block_tokens)
        per_layer, states = self._parse_checkpoints(checkpoints, len(keys))
        if pages is not None:
            if not isinstance(pages, Sequence) or isinstance(pages, (str, bytes)):
                raise TypeError(f"pages: expected None or a list with one entry per full block, got {_describe(pages)}")
            if len(pages) != len(keys):
                raise ValueError(f"pages: expected one entry per full block of token_ids ({len(keys)}), "
                                 f"got {len(pages)}")
        with self._lock:
            if states:
                self._check_layer_forms(per_layer, states)
            parent, new_blocks, stored, unused = None, 0, [], []  # stored: blocks given a checkpoint
            for i, key in enumerate(keys):
                block = self._blocks.get(key)
                entry = None if pages is None else pages[i]
                if block is None:
                    block = _Block(key, parent, (i + 1) * self.block_tokens, entry)
                    self._blocks[key] = block
                    if parent is not None:
                        parent.children += 1
                    new_blocks += 1
                elif pages is not None and entry != block.pages:
                    unused.append(entry)
                block.used = next(self._ticks)
                if block.end in states and self.policy.keeps(i + 1, len(keys)):
                    if block.checkpoint is None:
                        block.checkpoint = tuple(s.detach().clone() for s in states[block.end])
                        block.checkpoint_bytes = sum(s.numel() * s.element_size() for s in block.checkpoint)
                        self._checkpoint_bytes += block.checkpoint_bytes
                        self._checkpoints[key] = block
                        stored.append(block)
                    else:
                        self._checkpoints.move_to_end(key)
                parent = block
            self._enforce_budget()
            # report what survived the budget: a checkpoint larger than it goes at once
            kept = tuple(b.end for b in stored if b.checkpoint is not None)
        return Inserted(new_blocks=new_blocks, checkpoint_positions=kept, unused_pages=tuple(unused))

    def evict(self, blocks: int = 0, checkpoint_bytes: int = 0) -> Eviction:
        """Evict up to `blocks` blocks (least recently used unpinned leaves first, with their
        checkpoints), then checkpoints until at least `checkpoint_bytes` are freed in all (least
        recently used unpinned first). Returns the evicted blocks' page entries for the caller
        to free; fewer when the rest is pinned or the prefix of a cached block."""
        blocks = _count("blocks", blocks)
        checkpoint_bytes = _count("checkpoint_bytes", checkpoint_bytes)
        with self._lock:
            before = (self._counters["evicted_blocks"], self._counters["evicted_checkpoints"], self._checkpoint_bytes)
            pages = self._evict_blocks(blocks)
            self._evict_checkpoints(lambda: before[2] - self._checkpoint_bytes >= checkpoint_bytes)
            return Eviction(pages=tuple(pages), blocks=self._counters["evicted_blocks"] - before[0],
                            checkpoints=self._counters["evicted_checkpoints"] - before[1],
                            checkpoint_bytes=before[2] - self._checkpoint_bytes)

    def stats(self) -> PrefixCacheStats:
        with self._lock:
            return PrefixCacheStats(**self._counters, blocks=len(self._blocks), checkpoints=len(self._checkpoints),
                                    checkpoint_bytes=self._checkpoint_bytes, live_hits=len(self._live))

    def check_invariants(self) -> None:
        """Verify the invariants of the module docstring (for tests and debugging); a broken one
        is a RuntimeError naming it."""
        with self._lock:
            children: dict[bytes, int] = {}
            for block in self._blocks.values():
                if block.parent is not None:
                    if self._blocks.get(block.parent.key) is not block.parent:
                        raise RuntimeError(f"prefix-closed: the parent of the block ending at {block.end} is not cached")
                    children[block.parent.key] = children.get(block.parent.key, 0) + 1
            pins: dict[bytes, int] = {}
            checkpoint_pins: dict[bytes, int] = {}
            for matched, resume in self._live.values():
                for block in matched:
                    pins[block.key] = pins.get(block.key, 0) + 1
                if resume is not None:
                    checkpoint_pins[resume.key] = checkpoint_pins.get(resume.key, 0) + 1
                    if resume.checkpoint is None:
                        raise RuntimeError("pins: a live hit's checkpoint was evicted")
                if any(self._blocks.get(block.key) is not block for block in matched):
                    raise RuntimeError("pins: a live hit's block was evicted")
            for key, block in self._blocks.items():
                if block.children != children.get(key, 0):
                    raise RuntimeError(f"prefix-closed: the block ending at {block.end} counts {block.children} "
                                       f"children, {children.get(key, 0)} are cached")
                if block.pins != pins.get(key, 0) or block.checkpoint_pins != checkpoint_pins.get(key, 0):
                    raise RuntimeError(f"pins: the block ending at {block.end} has pins {block.pins}/"
                                       f"{block.checkpoint_pins}, live hits hold {pins.get(key, 0)}/"
                                       f"{checkpoint_pins.get(key, 0)}")
                if (block.checkpoint is not None) != (key in self._checkpoints):
                    raise RuntimeError(f"budget: the checkpoint at {block.end} is not in the LRU order")
            held = list(self._checkpoints.values())
            if any(self._blocks.get(b.key) is not b for b in held):
                raise RuntimeError("budget: a held checkpoint's block is not cached")
            total = sum(b.checkpoint_bytes for b in held)
            if total != self._checkpoint_bytes:
                raise RuntimeError(f"budget: checkpoint_bytes is {self._checkpoint_bytes}, the checkpoints hold {total}")
            if self._over_budget() and any(b.checkpoint_pins == 0 for b in held):
                raise RuntimeError(f"budget: {total} bytes held over {self.max_checkpoint_bytes} with unpinned "
                                   "checkpoints")

    # --- internals (called with the lock held, except _parse_checkpoints) -----------------------

    def _parse_checkpoints(self, checkpoints, prompt_blocks: int) -> tuple[bool | None, dict[int, tuple]]:
        """checkpoints as (per_layer, {position: (state of each layer)}), or ValueError/TypeError
        naming the first bad entry (position, layer, tensor)."""
        if checkpoints is None:
            return None, {}
        if isinstance(checkpoints, Mapping):
            per_layer, layers = False, [checkpoints]
        elif isinstance(checkpoints, Sequence) and not isinstance(checkpoints, (str, bytes)) \
                and all(isinstance(layer, Mapping) for layer in checkpoints):
            per_layer, layers = True, list(checkpoints)
            if not layers:
                raise ValueError("checkpoints: expected one dict per layer, got an empty list")
        else:
            raise TypeError(f"checkpoints: expected a dict {{position: state}} or a list of them (one per layer), "
                            f"got {_describe(checkpoints)}")
        limit = prompt_blocks * self.block_tokens
        for index, layer in enumerate(layers):
            where = f"checkpoints[{index}]" if per_layer else "checkpoints"
            first = next(iter(layer.values()), None)
            for position, state in layer.items():
                if isinstance(position, bool) or not isinstance(position, numbers.Integral) or position <= 0 \
                        or position % self.block_tokens or position > limit:
                    raise ValueError(f"{where}: expected positions that are multiples of block_tokens "
                                     f"{self.block_tokens} in {self.block_tokens}..{limit} (the prompt's full "
                                     f"blocks), got {position!r}")
                if not isinstance(state, torch.Tensor) or state.ndim != 3 or not state.dtype.is_floating_point:
                    raise ValueError(f"{where}[{position}]: expected a floating-point state [HV, K, V], "
                                     f"got {_describe(state)}")
                if _form(state) != _form(first):
                    raise ValueError(f"{where}[{position}]: expected {_describe(first)} like the other positions, "
                                     f"got {_describe(state)}")
            if set(layer) != set(layers[0]):
                raise ValueError(f"{where}: expected the positions of checkpoints[0] {sorted(layers[0])}, "
                                 f"got {sorted(layer)}")
        positions = layers[0]
        return per_layer, {int(p): tuple(layer[p] for layer in layers) for p in positions}

    def _check_layer_forms(self, per_layer: bool, states: dict[int, tuple]) -> None:
        """The first insert with checkpoints fixes the form (dict or list), the layer count and
        each layer's (shape, dtype, device); later ones must match."""
        some = next(iter(states.values()))
        forms = tuple(_form(s) for s in some)
        if self._per_layer is None:
            self._per_layer, self._layer_forms = per_layer, forms
            return
        if per_layer != self._per_layer:
            earlier = "a list of dicts (one per layer)" if self._per_layer else "one dict (one layer)"
            now = "a list of dicts" if per_layer else "one dict"
            raise TypeError(f"checkpoints: expected {earlier} as earlier inserts, got {now}")
        if len(forms) != len(self._layer_forms):
            raise ValueError(f"checkpoints: expected {len(self._layer_forms)} layers as earlier inserts, "
                             f"got {len(forms)}")
        for index, (form, expected) in enumerate(zip(forms, self._layer_forms)):
            if form != expected:
                where = f"checkpoints[{index}]" if per_layer else "checkpoints"
                raise ValueError(f"{where}: expected states of {_show_form(expected)} as earlier inserts, "
                                 f"got {_show_form(form)}")

    def _over_budget(self) -> bool:
        return self.max_checkpoint_bytes is not None and self._checkpoint_bytes > self.max_checkpoint_bytes

    def _enforce_budget(self) -> None:
        self._evict_checkpoints(lambda: not self._over_budget())

    def _evict_checkpoints(self, enough) -> None:
        """Drop unpinned checkpoints, least recently used first, until enough() or none is left."""
        for block in list(self._checkpoints.values()):
            if enough():
                return
            if block.checkpoint_pins == 0:
                self._drop_checkpoint(block)

    def _drop_checkpoint(self, block: _Block) -> None:
        del self._checkpoints[block.key]
        self._checkpoint_bytes -= block.checkpoint_bytes
        block.checkpoint, block.checkpoint_bytes = None, 0
        self._counters["evicted_checkpoints"] += 1

    def _evict_blocks(self, count: int) -> list:
        """Evict up to `count` unpinned leaf blocks, least recently used first; a parent whose
        last child goes becomes a candidate itself."""
        if count == 0:
            return []
        candidates = [(b.used, b.key) for b in self._blocks.values() if b.children == 0 and b.pins == 0]
        heapq.heapify(candidates)
        pages = []
        while candidates and len(pages) < count:
            _, key = heapq.heappop(candidates)
            block = self._blocks.pop(key)
            if block.checkpoint is not None:
                self._drop_checkpoint(block)
            pages.append(block.pages)
            self._counters["evicted_blocks"] += 1
            parent = block.parent
            if parent is not None:
                parent.children -= 1
                if parent.children == 0 and parent.pins == 0:
                    heapq.heappush(candidates, (parent.used, parent.key))
        return pages


def _form(state: torch.Tensor) -> tuple:
    return tuple(state.shape), state.dtype, state.device


def _show_form(form: tuple) -> str:
    shape, dtype, device = form
    return f"shape {shape} {str(dtype).removeprefix('torch.')} on {device}"
