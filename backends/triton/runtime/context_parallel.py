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


class _ContextParallel:
    """The host side of context parallelism for one layer. transition: how a summary's M is held
    ("full": [HV, K, K]; "diagonal": [HV, K]; "scalar": [HV]; "identity": no M); vk: states are
    held transposed ([HV, V, K]); state_shape: one sequence's state; chunk_fn: the plain chunk
    entry; segments_fn: chunk_segments (one prepare, the summaries, the combine, the finish);
    scan_programs: the programs its scan launches per sequence; tuned: () -> the chunk entry's
    launch table (k3c tune; its buckets may hold a tuned P under "segments"), or None."""

    def __init__(self, chunk_fn, segments_fn, transition, vk, state_shape, chunk_size, scan_programs, tuned):
        self.chunk_fn, self.segments_fn, self.scan_programs = chunk_fn, segments_fn, scan_programs
        self.tuned = tuned
        self.transition, self.vk, self.state_shape, self.chunk_size = transition, vk, state_shape, chunk_size

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

    # --- checks ---------------------------------------------------------------------------------

    def check_states(self, states, count, device, what):
        if states is None:
            return
        if not isinstance(states, torch.Tensor) or states.dim() != 1 + len(self.state_shape):
            got = list(states.shape) if isinstance(states, torch.Tensor) else type(states).__name__
            raise ValueError(f"initial_state: expected [{count},{','.join(map(str, self.state_shape))}] ({what}), got {got}")
        if states.shape[0] != count:
            raise ValueError(f"initial_state: expected {count} states ({what}), got {states.shape[0]}")
        _check_tensor("initial_state", states, ",".join(map(str, (count, *self.state_shape))), "float32", {}, device)

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

    def run_segments(self, dims, tokens, params, initial_state, output_final_state, cu_seqlens, checkpoint_every,
                     segments, exchange=None):
        """chunk(...) with every sequence split into `segments` segments (see `chunk`). exchange
        (ranks): called in the combine step with the summary of the last sequence (its segments
        composed), returns the initial states of the sequences (this rank's pieces)."""
        B, T = dims["B"], dims["T"]
        device = next(iter(tokens.values())).device
        _check_offsets("cu_seqlens", cu_seqlens, dict(B=B, T=T), device)
        if cu_seqlens is None:
            sequences = [(b * T, (b + 1) * T) for b in range(B)]
        else:
            offsets = cu_seqlens.tolist()
            sequences = list(zip(offsets, offsets[1:]))
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
        # the segments, sequence after sequence: edges[s] .. edges[s + 1]; sequence n's are
        # first[n] .. first[n] + count[n] - 1
        edges, first, count = [0], [], []
        for start, end in sequences:
            cuts = self.split(start, end, segments, unit, checkpoint_every is not None)
            first.append(len(edges) - 1)
            count.append(len(cuts) - 1)
            edges += cuts[1:]
        last = [f + c - 1 for f, c in zip(first, count)]
        flat = {name: x.reshape(1, B * T, *x.shape[2:]) for name, x in tokens.items()}
        edges_tensor = torch.tensor(edges, dtype=torch.int64, device=device)
        if max(count) == 1 and exchange is None:  # no sequence was split: nothing to combine
            result = self.chunk_fn(**flat, **params, initial_state=initial_state, output_final_state=output_final_state,
                                   cu_seqlens=edges_tensor, checkpoint_every=checkpoint_every)
        else:
            # the combine's index plan, one copy to the device: each sequence's first segment, then
            # for j = 1, 2, ... the segments that are the j-th of their sequence
            steps = [[f + j for f, c in zip(first, count) if c > j] for j in range(1, max(count))]
            plan = torch.tensor(first + [s for step in steps for s in step], dtype=torch.int64, device=device)
            firsts, later = plan[:len(first)], plan[len(first):].split([len(step) for step in steps]) if steps else ()

            def entering_states(M, N):
                starts = initial_state
                if exchange is not None:
                    summary = (None if M is None else M[first[-1]], N[first[-1]])
                    for segment in range(first[-1] + 1, last[-1] + 1):
                        summary = self.compose((None if M is None else M[segment], N[segment]), summary)
                    starts = exchange(*summary)
                entering = torch.zeros(len(edges) - 1, *self.state_shape, dtype=torch.float32, device=device)
                if starts is not None:
                    entering[firsts] = starts
                for segment in later:  # the summary of the segment before it
                    entering[segment] = self.apply(None if M is None else M[segment - 1], N[segment - 1],
                                                   entering[segment - 1])
                return entering

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

    # --- ranks of a process group ---------------------------------------------------------------

    def summary_numel(self):
        HV = self.state_shape[0]
        K = self.state_shape[2] if self.vk else self.state_shape[1]
        M = {"full": HV * K * K, "diagonal": HV * K, "scalar": HV, "identity": 0}[self.transition]
        return M, HV * self.state_shape[1] * self.state_shape[2]

    def run_group(self, group, check, tokens, params, initial_state, output_final_state, cu_seqlens,
                  checkpoint_every, segments):
        """chunk(...) over the ranks of `group` (see `chunk`). check() checks the per-token inputs
        and returns their dims. A ValueError on one rank is raised on every rank after the
        all-gather (no rank is left waiting in it)."""
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise ValueError("cp_group: torch.distributed is not initialized (call init_process_group first)")
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        M_numel, N_numel = self.summary_numel()
        device = next(iter(tokens.values())).device
        try:
            dims = check()
            pieces, header = self.plan_group(rank, world, dims, device, initial_state, cu_seqlens, checkpoint_every,
                                             segments)
        except ValueError:  # the others wait in the all-gather: join it, then raise
            device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else "cpu"
            payload = torch.zeros(4 + M_numel + N_numel, dtype=torch.float32, device=device)
            payload[:4] = torch.tensor([1, 0, 0, 0], dtype=torch.int32).view(torch.float32).to(device)
            dist.all_gather([torch.empty_like(payload) for _ in range(world)], payload, group=group)
            raise
        T = dims["T"]
        lo, hi = rank * T, (rank + 1) * T

        def exchange(M, N):
            """The all-gather of the summary of the piece that continues into the next rank (its
            sequence's initial state folded into N where it starts here), then the prefix combine
            of the earlier ranks' pieces of the first piece's sequence: every piece's initial state."""
            payload = torch.zeros(4 + M_numel + N_numel, dtype=torch.float32, device=device)
            payload[:4] = header.to(device)
            if pieces[-1][1] > hi:
                if pieces[-1][0] >= lo and initial_state is not None:
                    N = self.apply(M, N, initial_state[-1])
                if M is not None:
                    payload[4:4 + M_numel] = M.reshape(-1)
                payload[4 + M_numel:] = N.reshape(-1)
            gathered = [torch.empty_like(payload) for _ in range(world)]
            dist.all_gather(gathered, payload, group=group)
            headers = [row[:4].cpu().view(torch.int32).tolist() for row in gathered]
            failed = [j for j, h in enumerate(headers) if h[0]]
            if failed:
                raise ValueError(f"cp_group: rank {failed[0]} rejected its arguments (its ValueError says which)")
            if any(h != headers[0] for h in headers):
                raise ValueError(f"cp_group: the ranks disagree on T or cu_seqlens (T, offsets, checksum per rank: "
                                 f"{[h[1:] for h in headers]})")
            if pieces[0][0] >= lo:
                return initial_state
            S = None
            for j in range(pieces[0][0] // T, rank):
                N_j = gathered[j][4 + M_numel:].reshape(self.state_shape)
                S = N_j if S is None else self.apply(self.held(gathered[j][4:4 + M_numel]), N_j, S)
            rest = initial_state if initial_state is not None else \
                torch.zeros(len(pieces) - 1, *self.state_shape, dtype=torch.float32, device=device)
            return torch.cat([S[None], rest])

        local = torch.tensor([0] + [min(e, hi) - lo for _, e in pieces], dtype=torch.int64, device=device)
        o, final_state = self.run_segments(dims, tokens, params, None, output_final_state, local, None, segments,
                                           exchange=exchange)
        if final_state is not None and pieces[-1][1] > hi:
            final_state = final_state[:-1]  # the last piece's sequence ends on a later rank
        return o, final_state

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
