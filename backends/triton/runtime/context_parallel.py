"""The host side of context parallelism in the compiled modules (docs/context-parallel.md): the
runtime that a compiled `chunk` hands `segments=P` and `cp_group=group` to. A real module,
imported by the tests; the printer emits everything below the marker into each compiled module
that has both a chunk and a chunk_segments entry (backends/triton/context_parallel.py).
"""

import torch

from k3compile.backends.triton.runtime.checks import _check_offsets, _check_tensor, _tuned_launch

# --- emitted into every compiled module (above: what this file needs to be imported) ---

# --- context parallelism (docs/context-parallel.md) ----------------------------------------------
# A segment of a sequence maps the state entering it to the state leaving it, S -> M S + N: its
# summary (segment_summary). Summaries compose: (M2, N2) o (M1, N1) = (M2 M1, M2 N1 + N2). So the
# segments of a sequence run in parallel (chunk_segments): one prepare, their summaries, a prefix
# of the combine per sequence for every segment's true entering state, then the scan that
# finishes every segment from it. Across ranks the same, the summaries of the pieces that
# continue into the next rank exchanged by one all-gather of fixed size.
# The backward: a segment's entering state's cotangent is M^T (its leaving state's) + N_bar,
# N_bar the cotangent from its own outputs alone; so the leaving cotangents come from the same
# combine on the adjoint summaries (M^T, N_bar), run from the last segment back
# (chunk_backward_segments); across ranks one more all-gather of the same size.


class _ContextParallel:
    """The host side of context parallelism for one layer. transition: how a summary's M is held
    ("full": [HV, K, K]; "diagonal": [HV, K]; "scalar": [HV]; "identity": no M); vk: states are
    held transposed ([HV, V, K]); state_shape: one sequence's state; chunk_fn: the plain chunk
    entry; segments_fn: chunk_segments (one prepare, the summaries, the combine, the finish);
    scan_programs: the programs its scan launches per sequence; tuned: () -> the chunk entry's
    launch table (k3c tune; its buckets may hold a tuned P under "segments"), or None; backward:
    (the plain chunk_backward entry, chunk_backward_segments, the names of what they return), or
    None."""

    def __init__(self, chunk_fn, segments_fn, transition, vk, state_shape, chunk_size, scan_programs, tuned,
                 backward=None):
        self.chunk_fn, self.segments_fn, self.scan_programs = chunk_fn, segments_fn, scan_programs
        self.tuned = tuned
        self.transition, self.vk, self.state_shape, self.chunk_size = transition, vk, state_shape, chunk_size
        self.backward_fn, self.backward_segments_fn, self.gradients = backward or (None, None, ())

    # --- the math -------------------------------------------------------------------------------

    def apply(self, M, N, S):
        """M S + N over leading dims: the state after a segment from the state before it (a vk
        state is S^T, so M S is S^T M^T)."""
        if self.transition == "full":
            moved = torch.matmul(S, M.transpose(-1, -2)) if self.vk else torch.matmul(M, S)
        elif self.transition == "diagonal":
            moved = S * (M[..., None, :] if self.vk else M[..., :, None])
        elif self.transition == "scalar":
            moved = S * M[..., None, None]
        else:
            moved = S
        return moved + N

    def transpose(self, M):
        """M^T held in M's form, for the adjoint combine (D -> M^T D + N_bar): a full M transposed;
        a diagonal, a scalar and the identity are their own transposes."""
        return M.transpose(-1, -2) if self.transition == "full" and M is not None else M

    # --- checks ---------------------------------------------------------------------------------

    def check_states(self, states, count, device, what, name="initial_state"):
        if states is None:
            return
        if not isinstance(states, torch.Tensor) or states.dim() != 1 + len(self.state_shape):
            got = list(states.shape) if isinstance(states, torch.Tensor) else type(states).__name__
            raise ValueError(f"{name}: expected [{count},{','.join(map(str, self.state_shape))}] ({what}), got {got}")
        if states.shape[0] != count:
            raise ValueError(f"{name}: expected {count} states ({what}), got {states.shape[0]}")
        _check_tensor(name, states, ",".join(map(str, (count, *self.state_shape))), "float32", {}, device)

    @staticmethod
    def check_segments(segments):
        if segments == "auto":
            return
        if isinstance(segments, bool) or not isinstance(segments, int) or segments < 1:
            raise ValueError(f"segments: expected a positive int (the segments per sequence; 1: no split) or 'auto', "
                             f"got {segments!r}")

    # segments="auto": scan programs for PROGRAMS_PER_SM per multiprocessor (the scan kernel holds
    # two per SM on the H200), and segments of at least MIN_SEGMENT_TOKENS tokens: on the H200
    # (bench/RESULTS.md, "Context parallelism", tree 5e769da) segments of 16384 tokens paid (B1 T131072 H16,
    # P = 8: 7.6 ms vs 9.2 plain), of 8192 did not at B2 T16384 (P = 2: 3.4 ms vs 1.4): the
    # summary's scans and the combine cost more than a short scan saves
    PROGRAMS_PER_SM = 2
    MIN_SEGMENT_TOKENS = 16384

    def auto_segments(self, lengths, device, dtype=None):
        """P for segments='auto': the tuned P of this call's bucket (k3c tune), else the heuristic:
        1 when the sequences' scan programs already fill the GPU."""
        if self.tuned is not None and lengths:
            dims = dict(B=1, T=sum(lengths), N=len(lengths))
            tuned = _tuned_launch(self.tuned(), "segments", dtype, dims, self.state_shape[0], {})
            if "P" in tuned:
                return tuned["P"]
        processors = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
        P = max(1, self.PROGRAMS_PER_SM * processors // max(1, len(lengths) * self.scan_programs))
        return max(1, min(P, max(lengths, default=0) // self.MIN_SEGMENT_TOKENS))

    # --- segments on one device -----------------------------------------------------------------

    @staticmethod
    def split(start, end, segments, unit, whole_units):
        """The cuts of one sequence into at most `segments` near-equal segments: at multiples of
        `unit` tokens from its start while it has that many units (or when whole_units), else at
        single tokens (segments shorter than a unit; one token each at the least). An empty
        sequence stays one empty segment."""
        length = end - start
        units = -(-length // unit)
        if length == 0:
            return [start, end]
        if units >= segments or whole_units:
            parts = min(segments, units)
            return sorted({min(start + (p * units // parts) * unit, end) for p in range(parts + 1)})
        return sorted({start + p * length // segments for p in range(segments + 1)})

    def compose(self, later, earlier):
        """The summary of two segments in a row, (M2, N2) o (M1, N1) = (M2 M1, M2 N1 + N2)."""
        (M2, N2), (M1, N1) = later, earlier
        if M2 is None:
            M = None
        elif self.transition == "full":
            M = torch.matmul(M2, M1)
        else:
            M = M2 * M1
        return M, self.apply(M2, N2, N1)

    def composed(self, M, N, first, last, adjoint=False):
        """The summary of segments first..last of one sequence, composed; adjoint: of their adjoint
        summaries (M^T, N_bar), the last segment first (the cotangent of the state the first
        enters from that of the state the last leaves)."""
        summary = None
        for s in range(last, first - 1, -1) if adjoint else range(first, last + 1):
            M_s = None if M is None else self.transpose(M[s]) if adjoint else M[s]
            summary = (M_s, N[s]) if summary is None else self.compose((M_s, N[s]), summary)
        return summary

    @staticmethod
    def sequences_of(dims, cu_seqlens, device):
        B, T = dims["B"], dims["T"]
        _check_offsets("cu_seqlens", cu_seqlens, dict(B=B, T=T), device)
        if cu_seqlens is None:
            return [(b * T, (b + 1) * T) for b in range(B)]
        offsets = cu_seqlens.tolist()
        return list(zip(offsets, offsets[1:]))

    def cut(self, sequences, segments, unit, whole_units):
        """The segments of all sequences, in order: their edges (segment s is edges[s] .. edges[s +
        1]), each sequence's first segment and its count."""
        edges, first, count = [0], [], []
        for start, end in sequences:
            cuts = self.split(start, end, segments, unit, whole_units)
            first.append(len(edges) - 1)
            count.append(len(cuts) - 1)
            edges += cuts[1:]
        return edges, first, count

    @staticmethod
    def plan(ends, count, direction, device):
        """The index plan of a combine, one copy to the device: each sequence's end segment (its
        first; direction -1: its last), then for j = 1, 2, ... the segments j away from it."""
        steps = [[e + direction * j for e, c in zip(ends, count) if c > j] for j in range(1, max(count))]
        plan = torch.tensor(ends + [s for step in steps for s in step], dtype=torch.int64, device=device)
        return plan[:len(ends)], plan[len(ends):].split([len(step) for step in steps]) if steps else ()

    def scan(self, M, N, given, segments, plan, direction, device):
        """Every segment's entering state (direction 1: from each sequence's initial state, the
        combine of the summary of the segment before), or the cotangent of the state it leaves
        (direction -1: from each sequence's final-state cotangent, the adjoint combine, M^T D +
        N_bar, of the segment after), in fp32, batched over the sequences."""
        ends, steps = plan
        out = torch.zeros(segments, *self.state_shape, dtype=torch.float32, device=device)
        if given is not None:
            out[ends] = given
        for segment in steps:
            other = segment - direction
            M_o = None if M is None else M[other] if direction > 0 else self.transpose(M[other])
            out[segment] = self.apply(M_o, N[other], out[other])
        return out

    def run_segments(self, dims, tokens, params, initial_state, output_final_state, cu_seqlens, checkpoint_every,
                     segments, exchange=None):
        """chunk(...) with every sequence split into `segments` segments (see `chunk`). exchange
        (ranks): called in the combine step with the summary of the last sequence (its segments
        composed), returns the initial states of the sequences (this rank's pieces)."""
        B, T = dims["B"], dims["T"]
        device = next(iter(tokens.values())).device
        sequences = self.sequences_of(dims, cu_seqlens, device)
        self.check_states(initial_state, len(sequences), device, "one per sequence")
        if segments == "auto":
            dtype = next(iter(tokens.values())).dtype
            segments = self.auto_segments([end - start for start, end in sequences], device, dtype)
        if segments == 1 and exchange is None:  # the plain entry, on the caller's own layout
            return self.chunk_fn(**tokens, **params, initial_state=initial_state, output_final_state=output_final_state,
                                 cu_seqlens=cu_seqlens, checkpoint_every=checkpoint_every)
        unit = self.chunk_size
        if checkpoint_every is not None:  # checkpoints count from a segment's start: cut at their multiples
            if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int) or checkpoint_every <= 0 \
                    or checkpoint_every % self.chunk_size:
                raise ValueError(f"checkpoint_every: expected a positive multiple of the chunk size {self.chunk_size}, "
                                 f"got {checkpoint_every!r}")
            unit = checkpoint_every
        edges, first, count = self.cut(sequences, segments, unit, checkpoint_every is not None)
        last = [f + c - 1 for f, c in zip(first, count)]
        flat = {name: x.reshape(1, B * T, *x.shape[2:]) for name, x in tokens.items()}
        edges_tensor = torch.tensor(edges, dtype=torch.int64, device=device)
        if max(count) == 1 and exchange is None:  # no sequence was split: nothing to combine
            result = self.chunk_fn(**flat, **params, initial_state=initial_state, output_final_state=output_final_state,
                                   cu_seqlens=edges_tensor, checkpoint_every=checkpoint_every)
        else:
            plan = self.plan(first, count, 1, device)

            def entering_states(M, N):
                starts = initial_state if exchange is None else exchange(*self.composed(M, N, first[-1], last[-1]))
                return self.scan(M, N, starts, len(edges) - 1, plan, 1, device)

            result = self.segments_fn(**flat, **params, output_final_state=output_final_state,
                                      cu_seqlens=edges_tensor, checkpoint_every=checkpoint_every,
                                      entering_states=entering_states)
        o, final_state = result[0].reshape(B, T, *result[0].shape[2:]), result[1]
        if final_state is not None:
            final_state = final_state[last]
        if checkpoint_every is None:
            return o, final_state
        checkpoints = result[2]
        if cu_seqlens is None:  # the plain entry's [N, T // every, ...]
            checkpoints = checkpoints.reshape(B, T // checkpoint_every, *checkpoints.shape[1:])
        return o, final_state, checkpoints

    def run_segments_backward(self, dims, tokens, params, initial_state, cu_seqlens, do, dht, output_dh0, segments,
                              states=None, cotangents=None):
        """chunk_backward(...) with every sequence split into `segments` segments as chunk splits it
        (see `chunk_backward`). states / cotangents (ranks): called in the combine steps, states
        as run_segments' exchange, cotangents with the adjoint summary of the first sequence (its
        segments', composed from the last), returning the final-state cotangents of the sequences."""
        B, T = dims["B"], dims["T"]
        device = next(iter(tokens.values())).device
        sequences = self.sequences_of(dims, cu_seqlens, device)
        if cotangents is None:
            self.check_states(initial_state, len(sequences), device, "one per sequence")
            self.check_states(dht, len(sequences), device, "one per sequence", "dht")
        if segments == "auto":
            dtype = next(iter(tokens.values())).dtype
            segments = self.auto_segments([end - start for start, end in sequences], device, dtype)
        plain = dict(do=do, dht=dht, output_dh0=output_dh0)
        if segments == 1 and cotangents is None:
            return self.backward_fn(**tokens, **params, initial_state=initial_state, cu_seqlens=cu_seqlens, **plain)
        edges, first, count = self.cut(sequences, segments, self.chunk_size, False)
        last = [f + c - 1 for f, c in zip(first, count)]
        flat = {name: x.reshape(1, B * T, *x.shape[2:]) for name, x in {**tokens, "do": do}.items()}
        edges_tensor = torch.tensor(edges, dtype=torch.int64, device=device)
        if max(count) == 1 and cotangents is None:  # no sequence was split
            result = self.backward_fn(**flat, **params, initial_state=initial_state, cu_seqlens=edges_tensor, dht=dht,
                                      output_dh0=output_dh0)
        else:
            forward, backward = self.plan(first, count, 1, device), self.plan(last, count, -1, device)

            def entering_states(M, N):
                starts = initial_state if states is None else states(*self.composed(M, N, first[-1], last[-1]))
                return self.scan(M, N, starts, len(edges) - 1, forward, 1, device)

            def leaving_cotangents(M, N_bar):
                ends = dht if cotangents is None else cotangents(*self.composed(M, N_bar, first[0], last[0], True))
                return self.scan(M, N_bar, ends, len(edges) - 1, backward, -1, device)

            result = self.backward_segments_fn(**flat, **params, cu_seqlens=edges_tensor, output_dh0=output_dh0,
                                               entering_states=entering_states, leaving_cotangents=leaving_cotangents)
        grads = [x.reshape(B, T, *x.shape[2:]) if name[1:] in tokens else x
                 for name, x in zip(self.gradients[:-1], result[:-1])]
        return (*grads, None if result[-1] is None else result[-1][first])

    # --- under autograd -------------------------------------------------------------------------

    def differentiable(self, check, tokens, params, initial_state, output_final_state, cu_seqlens, checkpoint_every,
                       segments, group):
        """chunk(..., segments / cp_group) as a differentiable op (_SplitChunk)."""
        if self.backward_fn is None:
            raise NotImplementedError("chunk: this module has no chunk_backward_segments entry (its pipeline lacks "
                                      "derive-backward,lower-backward,derive-segment-scan-backward): call it under "
                                      "torch.no_grad()")
        tensors = [n for n, x in params.items() if isinstance(x, torch.Tensor)]
        call = dict(check=check, tokens=list(tokens), names=[*tokens, *tensors, "initial_state"],
                    fixed={n: x for n, x in params.items() if n not in tensors}, output_final_state=output_final_state,
                    cu_seqlens=cu_seqlens, checkpoint_every=checkpoint_every, segments=segments, group=group)
        return _SplitChunk.apply(self, call, *tokens.values(), *(params[n] for n in tensors), initial_state)

    def run_call(self, call, named, kept):
        """The forward of a _SplitChunk call (kept: what the backward reuses)."""
        tokens, params = self.call_inputs(call, named)
        if call["group"] is not None:
            segments = 1 if call["segments"] is None else call["segments"]
            return self.run_group(call["group"], call["check"], tokens, params, named["initial_state"],
                                  call["output_final_state"], call["cu_seqlens"], call["checkpoint_every"], segments,
                                  kept)
        self.check_segments(call["segments"])
        return self.run_segments(call["check"](), tokens, params, named["initial_state"], call["output_final_state"],
                                 call["cu_seqlens"], call["checkpoint_every"], call["segments"])

    def run_call_backward(self, call, named, do, dht, output_dh0, kept):
        """The gradients of a _SplitChunk call, chunk_backward's (over ranks from the kept
        entering state: the adjoint combine's all-gather only)."""
        tokens, params = self.call_inputs(call, named)
        if call["group"] is not None:
            segments = 1 if call["segments"] is None else call["segments"]
            return self.run_group_backward(call["group"], call["check"], tokens, params, named["initial_state"],
                                           call["cu_seqlens"], do, dht, output_dh0, segments, kept)
        return self.run_segments_backward(call["check"](), tokens, params, named["initial_state"], call["cu_seqlens"],
                                          do, dht, output_dh0, call["segments"])

    @staticmethod
    def call_inputs(call, named):
        tokens = {n: named[n] for n in call["tokens"]}
        params = {**call["fixed"], **{n: named[n] for n in call["names"] if n not in tokens and n != "initial_state"}}
        return tokens, params

    # --- ranks of a process group ---------------------------------------------------------------

    def summary_numel(self):
        HV = self.state_shape[0]
        K = self.state_shape[2] if self.vk else self.state_shape[1]
        M = {"full": HV * K * K, "diagonal": HV * K, "scalar": HV, "identity": 0}[self.transition]
        return M, HV * self.state_shape[1] * self.state_shape[2]

    def payload(self, header, M, N, device):
        """This rank's row of an all-gather: its header, then a summary (M, N) or zeros."""
        M_numel, N_numel = self.summary_numel()
        payload = torch.zeros(4 + M_numel + N_numel, dtype=torch.float32, device=device)
        payload[:4] = header.to(device)
        if M is not None:
            payload[4:4 + M_numel] = M.reshape(-1)
        if N is not None:
            payload[4 + M_numel:] = N.reshape(-1)
        return payload

    def unpacked(self, row):
        """The summary (M in its form, N) of a gathered row."""
        M_numel, _ = self.summary_numel()
        return self.held(row[4:4 + M_numel]), row[4 + M_numel:].reshape(self.state_shape)

    @staticmethod
    def gather(group, world, payload, joined):
        """One all_gather of every rank's payload (joined counts it). Raises ValueError on every
        rank if one rank flagged an error or the ranks' headers disagree."""
        import torch.distributed as dist

        gathered = [torch.empty_like(payload) for _ in range(world)]
        joined.append(payload)
        dist.all_gather(gathered, payload, group=group)
        headers = [row[:4].cpu().view(torch.int32).tolist() for row in gathered]
        failed = [j for j, h in enumerate(headers) if h[0]]
        if failed:
            raise ValueError(f"cp_group: rank {failed[0]} rejected its arguments (its ValueError says which)")
        if any(h != headers[0] for h in headers):
            raise ValueError(f"cp_group: the ranks disagree on T or cu_seqlens (T, offsets, checksum per rank: "
                             f"{[h[1:] for h in headers]})")
        return gathered

    def group_call(self, group, run):
        """run(joined) on this rank of `group`. A ValueError before this rank joined any all-gather
        (a bad argument) joins one flagged as failed, then is raised: the other ranks raise at
        that all-gather too, and none is left waiting in it."""
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise ValueError("cp_group: torch.distributed is not initialized (call init_process_group first)")
        rank, world, joined = dist.get_rank(group), dist.get_world_size(group), []
        try:
            return run(rank, world, joined)
        except ValueError:
            if not joined:  # the others wait in the all-gather: join it, then raise
                device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" \
                    else "cpu"
                header = torch.tensor([1, 0, 0, 0], dtype=torch.int32).view(torch.float32)
                dist.all_gather([torch.empty(4 + sum(self.summary_numel()), device=device) for _ in range(world)],
                                self.payload(header, None, None, device), group=group)
            raise

    def exchange_states(self, group, world, joined, header, pieces, T, rank, initial_state, M, N, device):
        """The forward's all-gather of the summary of the piece that continues into the next rank
        (its sequence's initial state folded into N where it starts here), then the combine of the
        earlier ranks' pieces of the first piece's sequence: the state the first piece enters if
        it continues from an earlier rank, else None."""
        lo, hi = rank * T, (rank + 1) * T
        payload = self.payload(header, None, None, device)
        if pieces[-1][1] > hi:
            if pieces[-1][0] >= lo and initial_state is not None:
                N = self.apply(M, N, initial_state[-1])
            payload = self.payload(header, M, N, device)
        gathered = self.gather(group, world, payload, joined)
        if pieces[0][0] >= lo:
            return None
        S = None
        for j in range(pieces[0][0] // T, rank):
            M_j, N_j = self.unpacked(gathered[j])
            S = N_j if S is None else self.apply(M_j, N_j, S)
        return S

    def starts(self, S, pieces, initial_state, device):
        """The initial states of this rank's pieces: S (the continued piece's), then the given ones."""
        if S is None:
            return initial_state
        rest = initial_state if initial_state is not None else \
            torch.zeros(len(pieces) - 1, *self.state_shape, dtype=torch.float32, device=device)
        return torch.cat([S[None], rest])

    def exchange_cotangents(self, group, world, joined, header, pieces, T, rank, dht, M_t, N_bar, device):
        """The adjoint's all-gather: the adjoint summary (M^T, N_bar) of the first piece if it
        continues from an earlier rank (its final-state cotangent folded into N_bar where its
        sequence ends here), then the adjoint combine of the later ranks' down from the rank where
        the last piece's sequence ends: the final-state cotangents of this rank's pieces (the
        continuing piece's: the cotangent of the state the next rank's first piece enters)."""
        lo, hi = rank * T, (rank + 1) * T
        payload = self.payload(header, None, None, device)
        if pieces[0][0] < lo:
            if pieces[0][1] <= hi:  # ends here: no M^T needed by the earlier ranks
                N_bar = N_bar if dht is None else self.apply(M_t, N_bar, dht[0])
                M_t = None
            payload = self.payload(header, M_t, N_bar, device)
        gathered = self.gather(group, world, payload, joined)
        continues = pieces[-1][1] > hi
        ends = dht if dht is not None else \
            torch.zeros(len(pieces) - continues, *self.state_shape, dtype=torch.float32, device=device)
        if not continues:
            return ends
        D = None
        for j in range((pieces[-1][1] - 1) // T, rank, -1):
            M_t, N_bar = self.unpacked(gathered[j])
            D = N_bar if D is None else self.apply(M_t, N_bar, D)
        return torch.cat([ends, D[None]])

    def run_group(self, group, check, tokens, params, initial_state, output_final_state, cu_seqlens,
                  checkpoint_every, segments, kept=None):
        """chunk(...) over the ranks of `group` (see `chunk`). check() checks the per-token inputs
        and returns their dims. A ValueError on one rank is raised on every rank after the
        all-gather (no rank is left waiting in it). kept (a dict): gets the state this rank's first
        piece enters ("entering": None where it starts here), for the backward."""
        device = next(iter(tokens.values())).device

        def run(rank, world, joined):
            dims = check()
            pieces, header = self.plan_group(rank, world, dims, device, initial_state, cu_seqlens, checkpoint_every,
                                             segments)
            T = dims["T"]
            lo, hi = rank * T, (rank + 1) * T

            def exchange(M, N):
                S = self.exchange_states(group, world, joined, header, pieces, T, rank, initial_state, M, N, device)
                if kept is not None:
                    kept["entering"] = S
                return self.starts(S, pieces, initial_state, device)

            local = torch.tensor([0] + [min(e, hi) - lo for _, e in pieces], dtype=torch.int64, device=device)
            o, final_state = self.run_segments(dims, tokens, params, None, output_final_state, local, None, segments,
                                               exchange=exchange)
            if final_state is not None and pieces[-1][1] > hi:
                final_state = final_state[:-1]  # the last piece's sequence ends on a later rank
            return o, final_state

        return self.group_call(group, run)

    def run_group_backward(self, group, check, tokens, params, initial_state, cu_seqlens, do, dht, output_dh0,
                           segments, kept=None):
        """chunk_backward(...) over the ranks of `group` (see `chunk_backward`): this rank's
        tokens' backward from their entering states (the forward's all-gather again, or, given
        `kept` from run_group, none), with the continuing piece's final-state cotangent from the
        adjoint combine's all-gather. check() checks the per-token inputs (and do)."""
        device = next(iter(tokens.values())).device

        def run(rank, world, joined):
            dims = check()
            pieces, header = self.plan_group(rank, world, dims, device, initial_state, cu_seqlens, None, segments)
            T = dims["T"]
            lo, hi = rank * T, (rank + 1) * T
            continues = pieces[-1][1] > hi
            self.check_states(dht, len(pieces) - continues, device, "one per sequence ending on this rank", "dht")

            def states(M, N):
                S = kept["entering"] if kept is not None else \
                    self.exchange_states(group, world, joined, header, pieces, T, rank, initial_state, M, N, device)
                return self.starts(S, pieces, initial_state, device)

            def cotangents(M_t, N_bar):
                return self.exchange_cotangents(group, world, joined, header, pieces, T, rank, dht, M_t, N_bar, device)

            local = torch.tensor([0] + [min(e, hi) - lo for _, e in pieces], dtype=torch.int64, device=device)
            *grads, dh0 = self.run_segments_backward(dims, tokens, params, None, local, do, None, output_dh0, segments,
                                                     states, cotangents)
            if dh0 is not None and pieces[0][0] < lo:
                dh0 = dh0[1:]  # the first piece's sequence starts on an earlier rank
            return (*grads, dh0)

        return self.group_call(group, run)

    def plan_group(self, rank, world, dims, device, initial_state, cu_seqlens, checkpoint_every, segments):
        """This rank's pieces of sequences and the header of its part of the all-gather (no
        error, T, the offsets' count and checksum, as int32 bits). Raises ValueError for bad
        arguments."""
        self.check_segments(segments)
        B, T = dims["B"], dims["T"]
        if B != 1:
            raise ValueError(f"cp_group: expects this rank's slice of the packed tokens (batch size 1), got B = {B}")
        if T < 1:
            raise ValueError("cp_group: every rank must hold at least one token, got T = 0")
        if checkpoint_every is not None:
            raise ValueError("checkpoint_every: not supported with cp_group")
        lo, hi, total = rank * T, (rank + 1) * T, world * T
        offsets = [0, total] if cu_seqlens is None else self.global_offsets(cu_seqlens, total, world, T)
        # the pieces of sequences on this rank, in order; an empty sequence belongs to the rank of its offset
        pieces = [(s, e) for s, e in zip(offsets, offsets[1:])
                  if (s < hi and e > lo) or (s == e and min(s // T, world - 1) == rank)]
        starting = len(pieces) - (pieces[0][0] < lo)
        self.check_states(initial_state, starting, device, "one per sequence starting on this rank")
        checksum = sum((i + 1) * x for i, x in enumerate(offsets)) % (2**31 - 1)
        return pieces, torch.tensor([0, T, len(offsets), checksum], dtype=torch.int32).view(torch.float32)

    def held(self, flat):
        """A gathered M ([numel]) in its form's shape."""
        HV = self.state_shape[0]
        K = self.state_shape[2] if self.vk else self.state_shape[1]
        shape = {"full": (HV, K, K), "diagonal": (HV, K), "scalar": (HV,), "identity": None}[self.transition]
        return None if shape is None else flat.reshape(shape)

    @staticmethod
    def global_offsets(cu_seqlens, total, world, T):
        if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2 \
                or cu_seqlens.dtype not in (torch.int32, torch.int64):
            got = list(cu_seqlens.shape) if isinstance(cu_seqlens, torch.Tensor) else type(cu_seqlens).__name__
            raise ValueError(f"cu_seqlens: with cp_group, expected [N+1] int32/int64 offsets into all ranks' tokens, got {got}")
        offsets = cu_seqlens.tolist()
        if offsets[0] != 0 or offsets[-1] != total or any(b < a for a, b in zip(offsets, offsets[1:])):
            raise ValueError(f"cu_seqlens: with cp_group, global offsets rising from 0 to world size * T = {world} * {T} "
                             f"= {total} (the same on every rank), got {offsets[0]} .. {offsets[-1]}")
        return offsets


def _needs_grad(*tensors):
    return torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in tensors)


class _SplitChunk(torch.autograd.Function):
    """chunk(..., segments=P or cp_group=group) as a differentiable op: the forward by the
    context-parallel chunk, the backward by chunk_backward with the same segments / cp_group (over
    ranks from the entering state the forward kept: one all-gather in the backward, the adjoint
    combine's). Gradients in each input's dtype; checkpoints are not differentiated."""

    @staticmethod
    def forward(ctx, cp, call, *tensors):
        named = dict(zip(call["names"], tensors))
        kept = {} if call["group"] is not None else None
        out = tuple(cp.run_call(call, named, kept))
        ctx.set_materialize_grads(False)
        ctx.cp, ctx.call, ctx.kept, ctx.o = cp, call, kept, (out[0].shape, out[0].dtype, out[0].device)
        ctx.save_for_backward(*tensors)
        if len(out) > 2:
            ctx.mark_non_differentiable(out[2])
        return out

    @staticmethod
    def backward(ctx, do, dht, *checkpoints):
        cp, call = ctx.cp, ctx.call
        tensors = ctx.saved_tensors
        named = dict(zip(call["names"], tensors))
        shape, dtype, device = ctx.o
        do = torch.zeros(shape, dtype=dtype, device=device) if do is None else do.contiguous()
        dht = None if dht is None else dht.contiguous()
        wants_dh0 = named["initial_state"] is not None and ctx.needs_input_grad[-1]
        grads = dict(zip(cp.gradients, cp.run_call_backward(call, named, do, dht, wants_dh0, ctx.kept)))
        out = [grads.get("dh0" if n == "initial_state" else f"d{n}") for n in call["names"]]
        return (None, None, *(None if g is None or x is None else g.to(x.dtype) for g, x in zip(out, tensors)))
