// The printed Triton of each recurrence member (k3c compile --stdout): the provenance header,
// the kernels in order with the provenance comment of each block, and the entries' signatures.
// Which token stages exist follows from the member: DeltaNet no gate load nor decay, GLA no
// beta nor delta correction (its rank-1 update takes v, the delta members the corrected u); chunk
// kernels likewise (no triangular solve without the delta rule).
// RUN: k3c compile %examples/kda.toml --stdout --no-autotune | filecheck %s --check-prefixes=ALL,KDA
// RUN: k3c compile %examples/gated_deltanet.toml --stdout --no-autotune | filecheck %s --check-prefixes=ALL,GDN
// RUN: k3c compile %examples/deltanet.toml --stdout --no-autotune | filecheck %s --check-prefixes=ALL,DN
// RUN: k3c compile %examples/gla.toml --stdout --no-autotune | filecheck %s --check-prefixes=ALL,GLA

// ALL:      compiled {{[a-z_]+}} layer (k3compile {{[0-9.]+}}). Needs only torch and triton.
// ALL:      spec: {{.*}}examples/{{[a-z_]+}}.toml (content sha256 {{[0-9a-f]+}})
// KDA:      layer: k3.recurrence @kda <gate = channel, delta_rule = true, num_heads = 32,
// GDN:      layer: k3.recurrence @gated_deltanet <gate = scalar, delta_rule = true, num_heads = 16, num_v_heads = 32,
// DN:       layer: k3.recurrence @deltanet <gate = none, delta_rule = true,
// GLA:      layer: k3.recurrence @gla <gate = channel, delta_rule = false,
// ALL:      pipeline: lower-recurrent,lower-decode,derive-chunkwise,fuse-chunkwise,derive-segment-scan,lower-segment-scan,derive-backward,lower-backward
// ALL:      import torch
// ALL-NEXT: import triton
// ALL-NEXT: import triton.language as tl

// The token kernel of `recurrent`: its stages as the member has them.
// ALL-LABEL: def {{[a-z_]+}}_recurrent_kernel(
// ALL:       HAS_CU_SEQLENS: tl.constexpr,
// ALL-NEXT:  ):
// ALL:       """k3s.kernel @{{[a-z_]+}}_recurrent <grid = [value_block, sequence_head], num_warps = 4, block_k = {{[0-9]+}}, block_v = {{[0-9]+}}, launch_params = [T], key_heads = {{[0-9]+}}>
// ALL:       # %S = k3s.state_tile %initial_state <head_k_dim = 128, head_v_dim = 128, block_v = 32, layout = {{kv|vk}}>
// ALL:       # %S_final = k3s.token_loop %S, %cu_seqlens: the tokens of sequence i_n, in order
// ALL:       # %q = k3s.load_token %q
// ALL:       # %k = k3s.load_token %k
// ALL:       # %v = k3s.load_token %v
// KDA:       # %g = k3s.load_gate %g <gate = channel, input = log, lower_bound = -5.0, floor = -110.0, layout = #k3s.layout<token[T], head[HV], column[K]>>: the log-decay g
// KDA-NEXT:  b_g = tl.load(g + (t * HV + i_hv) * K + o_k, mask=m_k, other=0.0).to(tl.float32)
// KDA-NEXT:  b_g = tl.maximum(b_g, -110.0)
// KDA-NEXT:  # %S = k3s.decay %S, %g <gate = channel>: S <- Diag(exp g_t) S
// GDN:       # %g = k3s.load_gate %g <gate = scalar, input = log, lower_bound = -5.0, floor = -110.0, layout = #k3s.layout<token[T], head[HV]>>: the log-decay g
// GDN:       # %S = k3s.decay %S, %g <gate = scalar>: S <- Diag(exp g_t) S
// GLA:       # %g = k3s.load_gate %g <gate = channel, input = log, lower_bound = -5.0, floor = -110.0, layout = #k3s.layout<token[T], head[HV], column[K]>>: the log-decay g
// GLA:       # %S = k3s.decay %S, %g <gate = channel>: S <- Diag(exp g_t) S
// DN-NOT:    k3s.decay
// GLA-NOT:   k3s.load_beta
// KDA:       # %beta = k3s.load_beta %beta <input = probability, layout = #k3s.layout<token[T], head[HV]>>
// GDN:       # %beta = k3s.load_beta %beta <input = probability, layout = #k3s.layout<token[T], head[HV]>>
// DN:        # %beta = k3s.load_beta %beta <input = probability, layout = #k3s.layout<token[T], head[HV]>>
// KDA-NEXT:  b_beta = tl.load(beta + t * HV + i_hv).to(tl.float32)
// KDA-NEXT:  # %u = k3s.delta_correct %S, %k, %v, %beta: u = beta_t (v_t - S^T k_t), kept in b_v
// GDN:       # %u = k3s.delta_correct %S, %k, %v, %beta
// DN:        # %u = k3s.delta_correct %S, %k, %v, %beta
// GLA-NOT:   k3s.delta_correct
// KDA:       # %S = k3s.rank1_update %S, %k, %u: S <- S + k_t u_t^T
// GDN:       # %S = k3s.rank1_update %S, %k, %u: S <- S + k_t u_t^T
// DN:        # %S = k3s.rank1_update %S, %k, %u: S <- S + k_t u_t^T
// GLA:       # %S = k3s.rank1_update %S, %k, %v: S <- S + k_t u_t^T
// ALL:       # %o = k3s.readout %S, %q, %o, %scale <layout = #k3s.layout<token[T], head[HV], column[V]>>: o_t = S^T (scale q_t)
// ALL:       # k3s.store_state %S_final, %final_state <layout = {{kv|vk}}>
// ALL-LABEL: def recurrent(q, k, v,
// ALL:       # k3s.entry @recurrent <source = @{{[a-z_]+}}>: argument checks
// ALL:       # k3s.kernel @{{[a-z_]+}}_recurrent <grid = [value_block, sequence_head], num_warps = 4, block_k = {{[0-9]+}}, block_v = {{[0-9]+}}, launch_params = [T], key_heads = {{[0-9]+}}>: launch

// The pool kernel of `decode`, then the chunk kernels: prepare (token-parallel), scan.
// ALL-LABEL: def {{[a-z_]+}}_decode_kernel(
// ALL:       # %S = k3s.state_tile %state, %state_indices <{{.*}}home = pool>
// ALL-LABEL: def decode(q, k, v, {{.*}}state=None, state_indices=None, check_indices=True):
// ALL-LABEL: def {{[a-z_]+}}_chunk_prepare_kernel(
// ALL:       DOT: tl.constexpr,
// ALL-NEXT:  ):
// KDA:       # %Gstart, %Gend = k3s.block_gates %G <sub_chunk = 16>: a row only ever meets references at or before itself (causal)
// KDA:       # %kr = k3s.block_rescale %k, %G, %Gend <decay = reference_over_row>
// KDA:       # %factorable = k3s.block_span_check %Gstart, %Gend <limit = 80.0>
// KDA-NEXT:  b_factorable = tl.max(tl.max(b_Gstart - b_Gend, axis=1), axis=0) <= 115.4156
// KDA:       # %A = k3s.gram %k, %k, %G, %Gstart, %Gend, %kl, %kr, %kd, %beta, %factorable, %k, %g <mask = strict, gate = channel, beta = true, diagonal = guarded, unroll = true, diagonal_rows = reload>
// KDA:       if b_factorable:
// KDA-NEXT:      # diagonal blocks: the left factor against the diagonal factor
// KDA:       else:
// KDA-NEXT:      # diagonal blocks elementwise, exp of differences (<= 1 for any gate): column r of every block,
// KDA:       # %T = k3s.forward_substitution %A, %beta <block = 1, accurate = true, squarings = 3>: T = (I + A)^-1 Diag(beta), blocked
// KDA:       # %W = k3s.wy_apply %T, %k, %G <gate = channel>
// GDN:       # %A = k3s.gram %k, %k, %G, %beta <mask = strict, gate = scalar, beta = true>
// GDN:       # %T = k3s.forward_substitution %A, %beta <block = 1, accurate = true, squarings = 3>
// DN:        # %A = k3s.gram %k, %k, %beta <mask = strict, gate = none, beta = true>
// DN:        # %T = k3s.forward_substitution %A, %beta <block = 1, accurate = true, squarings = 3>
// GLA-NOT:   k3s.forward_substitution
// GLA:       # %P = k3s.gram %q, %k, %G, %Gstart, %Gend, %ql, %kr, %kd, %factorable, %k, %g <mask = inclusive, gate = channel, beta = false, diagonal = guarded, unroll = true, diagonal_rows = reload>
// ALL-LABEL: def {{[a-z_]+}}_chunk_scan_kernel(
// ALL:       # %S_final = k3s.chunk_loop %S, %cu_seqlens <chunk_size = 16>: the chunks of sequence i_n, in order, carrying b_S
// KDA:       # %vr = k3s.delta_residual %S, %W, %U: Vr = U - W S
// GLA-NOT:   k3s.delta_residual
// KDA:       # %o = k3s.chunk_output %QG, %S, %P, %vr, %o, %scale <layout = #k3s.layout<token[T], head[HV], column[V]>>: O = scale (QG S + P Vr)
// GDN:       # %o = k3s.chunk_output %QG, %S, %P, %vr, %o, %scale <layout = #k3s.layout<token[T], head[HV], column[V]>>: O = scale (QG S + P Vr)
// DN:        # %o = k3s.chunk_output %q, %S, %P, %vr, %o, %scale <layout = #k3s.layout<token[T], head[HV], column[V]>>: O = scale (QG S + P Vr)
// GLA:       # %o = k3s.chunk_output %QG, %S, %P, %v, %o, %scale <layout = #k3s.layout<token[T], head[HV], column[V]>>: O = scale (QG S + P Vr)
// KDA:       # %S = k3s.state_advance %S, %KG, %vr, %gamma_C <gate = channel>
// GDN:       # %S = k3s.state_advance %S, %KG, %vr, %gamma_C <gate = scalar>
// DN:        # %S = k3s.state_advance %S, %k, %vr <gate = none>
// GLA:       # %S = k3s.state_advance %S, %KG, %v, %gamma_C <gate = channel>
// ALL-LABEL: def _chunk_single(q, k, v,
// ALL:       DOT=_DOT_OF_DTYPE[q.dtype],

// Context parallelism: the summary kernels, chunk_segments, and the `chunk` that takes segments / cp_group.
// ALL-LABEL: def segment_summary(k, v,
// ALL-LABEL: def chunk_segments(q, k, v,
// The backward (training): derive-backward's kernels and entry (tests/filecheck/passes/derive_backward.mlir
// has its IR). A scalar gate's Gram cotangents decay by pairs; a channel gate's are contracted under
// its decays, elementwise where a chunk's span check fails.
// ALL-LABEL: def {{[a-z_]+}}_backward_prepare_kernel(
// ALL-LABEL: def {{[a-z_]+}}_backward_state_scan_kernel(
// ALL-LABEL: def {{[a-z_]+}}_backward_cotangent_scan_kernel(
// ALL:       for i_rc in range(0, tl.cdiv(eos - bos, BC)):
// The cotangent summary of context parallelism (below) runs this code: what only the scan writes
// (the spills, dh0) under its flag, what only the summary writes (N_bar) under the flag off.
// ALL:           if SPILL_S_BAR{{(_VR_BAR)?}}:
// ALL-NEXT:          # k3s.spill %S_bar, %S
// ALL:           # k3s.store_state %S_final, %dh0 <layout = {{kv|vk}}>
// ALL-NEXT:      if HAS_DH0:
// ALL-NEXT:          tl.store(dh0 + p_state, b_S, mask=m_kv)
// ALL-NEXT:  # k3s.when <flag = SPILL_S_BAR{{(_VR_BAR)?}}, on = false>: skipped by launches that pass SPILL_S_BAR{{(_VR_BAR)?}}=True
// ALL-NEXT:  if not SPILL_S_BAR{{(_VR_BAR)?}}:
// ALL-NEXT:      # k3s.store_state %S_final, %N_bar <layout = {{kv|vk}}>
// ALL-NEXT:      tl.store(N_bar + p_state, b_S, mask=m_kv)
// ALL-LABEL: def {{[a-z_]+}}_backward_gradients_kernel(
// An unbounded channel gate: one code for two launches, the second (STEEP on) the steep chunks'.
// That launch reads the check the first recorded before it loads anything of the chunk.
// KDA-NOT:   tl.load(g +
// KDA:       k3s.when <flag = STEEP>: skipped by launches that pass STEEP=False
// KDA-NEXT:  if STEEP:
// KDA-NEXT:      # %factorable = k3s.recorded_check %steep_chunks
// KDA-NEXT:      b_factorable = tl.load(steep_chunks + (start // BC + i_n) * HV + i_hv) != 0.0
// KDA-NEXT:      # k3s.exit_unless %factorable <holds = false>
// KDA-NEXT:      if b_factorable:
// KDA-NEXT:          return
// KDA:       b_factored: tl.constexpr = not STEEP
// Every chunk's span check recorded, in the first launch, for the second.
// KDA:       k3s.when <flag = STEEP, on = false>: skipped by launches that pass STEEP=True
// KDA-NEXT:  if not STEEP:
// KDA:       k3s.record_check %steep_chunks, %factorable
// KDA-NEXT:  tl.store(steep_chunks + (start // BC + i_n) * HV + i_hv, b_factorable.to(tl.float32))
// The state and its cotangent a value block at a time; what contracts the value columns summed.
// ALL:       k3s.value_block_loop <block_v = 64, unroll = true>
// ALL-NEXT:  b_{{[A-Za-z_0-9]+}} = tl.zeros(
// ALL:       for i_vb in tl.static_range(0, (V + BV - 1) // BV):
// ALL:       b_S_bar = tl.load(S_bar + {{.*}}o_v[None, :]
// ALL:       k3s.sum_value_blocks
// KDA:       _mm_accurate(tl.trans(b_T_inverse), b_T_bar{{[_0-9]*}}, DOT)
// An unbounded channel gate's guarded forms, guarded by the launch's constexpr: factored in the
// first launch, elementwise in the second, each compiled with the other form gone.
// KDA:       k3s.gated_contraction %{{[A-Za-z_0-9]+}}, %{{[A-Za-z_0-9]+}}, %G, %factored <side = rows, form = guarded>
// KDA-NEXT:  if b_factored:
// KDA:       _mm(
// KDA:       else:
// KDA-NEXT:      = tl.zeros([BC, BK], dtype=tl.float32)
// KDA-NEXT:      for j in range(0, BC):
// KDA-NOT:   def kda_backward_gradients_steep_kernel(
// GDN:       k3s.mul %{{[A-Za-z_0-9]+}}, %{{[A-Za-z_0-9]*}}pair_decay
// DN-NOT:    k3s.gated_contraction
// ALL:       k3s.store_cotangent %{{[A-Za-z_0-9]+}}, %dq, %q
// ALL-LABEL: def _chunk_backward_single(q, k, v,
// The backward of context parallelism (derive-segment-scan-backward): chunk_backward's kernels, the
// cotangent scan also launched as the cotangent summary (from zero, storing N_bar, no spills), and
// two host steps: the combine and its adjoint.
// the training forward that keeps its prepare's spills and the backward that takes them
// (save-forward-values), after the backward, launching the other entries' kernel code
// ALL-LABEL: def chunk_saving(q, k, v, {{.*}}checkpoint_every=None):
// ALL:       _chunk_prepare_kernel[grid](
// ALL-LABEL: def chunk_backward_saved(q, k, v, {{.*}}output_dh0=False, {{.*}}=None):
// ALL-NOT:   _backward_prepare_kernel[grid](
// ALL:       _backward_state_scan_kernel[grid](
// ALL-NOT:   def {{[a-z_]+}}_backward_segments_cotangent_summary_kernel(
// ALL-LABEL: def chunk_backward_segments(q, k, v, {{.*}}entering_states=None, leaving_cotangents=None):
// ALL:       # k3s.kernel @{{[a-z_]+}}_backward_segments_cotangent_summary <{{.*}}flags = {SPILL_S_BAR{{(_VR_BAR)?}} = false}, shares_code_of = @{{[a-z_]+}}_backward_cotangent_scan{{[,>]}}
// ALL:       _backward_cotangent_scan_kernel[grid](
// ALL:       HAS_DHT=dht is not None,
// ALL:       SPILL_S_BAR{{(_VR_BAR)?}}=False,
// ALL:       initial_state = entering_states(M, N)
// ALL:       adjoint = true>: every segment's leaving cotangent
// ALL-NEXT:  dht = leaving_cotangents(M, N_bar)
// ALL:       _CHUNK_CP = _ContextParallel(_chunk_single, chunk_segments,
// ALL-LABEL: def chunk(q, k, v, {{.*}}checkpoint_every=None, segments=None, cp_group=None):
// ALL-LABEL: def chunk_backward(q, k, v, {{.*}}output_dh0=False, segments=None, cp_group=None):
// ALL:       __all__ = ['recurrent', 'decode', 'chunk', 'segment_summary', 'chunk_segments', 'chunk_backward', 'chunk_saving', 'chunk_backward_saved', 'chunk_backward_segments']
