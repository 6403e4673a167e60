// The printed Triton of an AttnRes spec: two fused kernels that score and mix each row in a
// single read of its sources, storing the row's log-sum-exp when the caller asks for it, one a
// program per row (calls of fewer than 2048 rows), one a group of rows a program walked as one
// loop over (row, source) pairs (the others); and the fused backward, one kernel over groups of
// rows that reads each source row once, recomputes the softmax from the saved log-sum-exp, writes
// its cotangent once and re-centres the query's cotangent per row (k3c compile --stdout).
// RUN: k3c compile %examples/attnres.toml --stdout --no-autotune | filecheck %s

// CHECK:      attnres: compiled attnres layer (k3compile {{[0-9.]+}}). Needs only torch and triton.
// CHECK:      layer: k3.attnres @attnres <hidden_size = 7168, num_blocks = 8, block_size = 12, eps = 1.0e-06, dtype = bfloat16>
// CHECK:      pipeline: fuse-attnres,derive-attnres-backward,derive-block-attnres,derive-block-attnres-backward,outline-kernels
// CHECK-LABEL: def attnres_aggregate_kernel(
// CHECK:      HAS_LSE: tl.constexpr,
// CHECK:      # %q = k3s.fold_query %query, %gain <hidden_size = 7168>: RMSNorm gain folded into the pseudo-query
// CHECK-NEXT: b_q = tl.load(query + o_d, mask=m_d, other=0.0).to(tl.float32) * tl.load(gain + o_d, mask=m_d, other=0.0).to(tl.float32)
// CHECK-NEXT: # %max, %sum, %acc = k3s.softmax_start: the online softmax before any source
// CHECK-NEXT: b_max = tl.full([], float("-inf"), dtype=tl.float32)
// CHECK-NEXT: b_sum = tl.zeros([], dtype=tl.float32)
// CHECK-NEXT: b_acc = tl.zeros([BD], dtype=tl.float32)
// the loop over sources pipelined by the kernel's num_stages: the next rows load while one is scored
// CHECK-NEXT: # %max, %sum, %acc = k3s.source_loop %max, %sum, %acc: each source row is read once
// CHECK-NEXT: for i_s in tl.range(0, S, num_stages=3):
// CHECK-NEXT:     b_x = tl.load(sources + (i_s * R + i_r) * D + o_d, mask=m_d, other=0.0).to(tl.float32)
// CHECK:      # %score = k3s.rms_score %x, %q <eps = 1.0e-06>: score = q . x / rms(x), as q . (x / s) / (rms(x) / s)
// CHECK:      # %max, %sum, %p, %rescale = k3s.online_softmax %max, %sum, %score
// CHECK:      # %acc = k3s.mix_accumulate %acc, %rescale, %p, %x
// CHECK:      # k3s.normalize_store %acc, %sum, %out
// CHECK-NEXT: tl.store(out + i_r * D + o_d, (b_acc / b_sum).to(out.dtype.element_ty), mask=m_d)
// CHECK-NEXT: # k3s.store_lse %max, %sum, %lse: the row's log-sum-exp over its sources, for the backward
// CHECK-NEXT: if HAS_LSE:
// CHECK-NEXT:     tl.store(lse + i_r, b_max + tl.log(b_sum))
// CHECK-LABEL: def attnres_aggregate_groups_kernel(
// CHECK:      b_acc = tl.zeros([BD], dtype=tl.float32)
// the group's (row, source) pairs pipelined by the kernel's num_stages: the next rows load while one is scored
// CHECK-NEXT: # %max, %sum, %acc = k3s.row_source_loop %max, %sum, %acc <rows = 8>: the program's rows and their sources as one loop, sources innermost
// CHECK-NEXT: for i_rs in tl.range(i_rg * BR * S, tl.minimum(i_rg * BR + BR, R) * S, num_stages=4):
// CHECK-NEXT:     i_r = i_rs // S
// CHECK-NEXT:     i_s = i_rs % S
// CHECK-NEXT:     # %max = k3s.row_start %max: a row's first source starts the online softmax anew
// CHECK-NEXT:     b_max = tl.where(i_s == 0, float("-inf"), b_max)
// CHECK-NEXT:     b_x = tl.load(sources + (i_s * R + i_r) * D + o_d, mask=m_d, other=0.0).to(tl.float32)
// CHECK:      # %score = k3s.rms_score %x, %q <eps = 1.0e-06>: score = q . x / rms(x), as q . (x / s) / (rms(x) / s)
// CHECK:      # %max, %sum, %p, %rescale = k3s.online_softmax %max, %sum, %score
// CHECK:      # %acc = k3s.mix_accumulate %acc, %rescale, %p, %x
// CHECK:      # k3s.at_row_end: after the row's last source
// CHECK-NEXT: if i_s == S - 1:
// CHECK-NEXT:     # k3s.normalize_store %acc, %sum, %out
// CHECK-NEXT:     tl.store(out + i_r * D + o_d, (b_acc / b_sum).to(out.dtype.element_ty), mask=m_d)
// CHECK-NEXT:     # k3s.store_lse %max, %sum, %lse: the row's log-sum-exp over its sources, for the backward
// CHECK-NEXT:     if HAS_LSE:
// CHECK-NEXT:         tl.store(lse + i_r, b_max + tl.log(b_sum))
// CHECK-LABEL: def aggregate(sources, query, gain, output_lse=False):
// CHECK:      # k3s.entry @aggregate <source = @attnres, max_sources = 9>: argument checks
// CHECK:      lse = _alloc((dims["B"], dims["T"]), torch.float32, sources.device) if output_lse else None
// each kernel launched by the calls its rows bounds hold
// CHECK:      # k3s.kernel @attnres_aggregate <grid = [row], num_warps = 4, num_stages = 3, block_d = 8192, max_rows = 2047, launch_params = [S, R]>: launch
// CHECK:      grid = (dims["B"] * dims["T"],)
// CHECK-NEXT: if all(grid) and dims["B"] * dims["T"] <= 2047:
// CHECK-NEXT:     attnres_aggregate_kernel[grid](
// CHECK:          num_stages=3,
// CHECK:      # k3s.kernel @attnres_aggregate_groups <grid = [row_group], num_warps = 4, num_stages = 4, block_d = 8192, min_rows = 2048, launch_params = [S, R]>: launch
// CHECK:      BR = 8
// CHECK-NEXT: grid = (triton.cdiv(dims["B"] * dims["T"], BR),)
// CHECK-NEXT: if all(grid) and dims["B"] * dims["T"] >= 2048:
// CHECK-NEXT:     attnres_aggregate_groups_kernel[grid](
// CHECK:              HAS_LSE=lse is not None,
// CHECK-NEXT:         num_warps=4,
// CHECK-NEXT:         num_stages=4,
// CHECK:      return out, lse

// CHECK-LABEL: def attnres_aggregate_backward_kernel(
// CHECK:      BR: tl.constexpr,
// CHECK:      # grid axis 0: a group of BR token rows, one after another, of width D
// CHECK-NEXT: i_rg = tl.program_id(0).to(tl.int64)
// CHECK:      # %q = k3s.fold_query %query, %gain <hidden_size = 7168>: RMSNorm gain folded into the pseudo-query
// CHECK:      # %q_bar = k3s.zeros
// CHECK:      b_q_bar = tl.zeros([BD], dtype=tl.float32)
// CHECK-NEXT: # %q_bar = k3s.row_loop %q_bar <rows = 16>: the program's rows, one after another
// CHECK-NEXT: for i_r in range(i_rg * BR, tl.minimum(i_rg * BR + BR, R)):
// CHECK-NEXT:     b_lse = tl.load(lse + i_r).to(tl.float32)
// CHECK-NEXT:     b_out = tl.load(out + i_r * D + o_d, mask=m_d, other=0.0).to(tl.float32)
// CHECK-NEXT:     b_dout = tl.load(dout + i_r * D + o_d, mask=m_d, other=0.0).to(tl.float32)
// CHECK-NEXT:     # %delta = k3s.softmax_delta %dout, %out: sum_i p_i (dh . x_i) = dh . h
// CHECK-NEXT:     b_delta = tl.sum(b_dout * b_out)
// CHECK-NEXT:     # %k_mean = k3s.zeros
// CHECK-NEXT:     b_k_mean = tl.zeros([BD], dtype=tl.float32)
// CHECK-NEXT:     # %score_bar_sum = k3s.zeros
// CHECK-NEXT:     b_score_bar_sum = tl.zeros([], dtype=tl.float32)
// CHECK-NEXT:     # %q_bar, %k_mean, %score_bar_sum = k3s.source_loop %q_bar, %k_mean, %score_bar_sum: each source row is read once
// CHECK-NEXT:     for i_s in tl.range(0, S, num_stages=3):
// CHECK-NEXT:         b_x = tl.load(sources + (i_s * R + i_r) * D + o_d, mask=m_d, other=0.0).to(tl.float32)
// CHECK-NEXT:         # %score = k3s.rms_score %x, %q <eps = 1.0e-06>: score = q . x / rms(x), as q . (x / s) / (rms(x) / s)
// CHECK-NEXT:         b_scale = tl.minimum(tl.maximum(tl.max(tl.abs(b_x)), 0.001), 8.507059173023462e+37)
// CHECK-NEXT:         b_inverse_scale = 1.0 / b_scale
// CHECK-NEXT:         b_scaled_row = b_x * b_inverse_scale
// CHECK-NEXT:         b_scaled_root_eps = 0.001 * b_inverse_scale
// CHECK-NEXT:         b_scaled_rms = tl.sqrt(tl.sum(b_scaled_row * b_scaled_row) / D + b_scaled_root_eps * b_scaled_root_eps)
// CHECK-NEXT:         b_score = tl.sum(b_scaled_row * b_q) / b_scaled_rms
// CHECK-NEXT:         # %p = k3s.softmax_weight %score, %lse: p = exp(score - L), from the saved log-sum-exp
// CHECK-NEXT:         b_p = tl.exp(b_score - b_lse)
// CHECK-NEXT:         # %dp = k3s.weight_cotangent %x, %dout: dp = dh . x
// CHECK-NEXT:         b_dp = tl.sum(b_dout * b_x)
// CHECK-NEXT:         # %score_bar = k3s.softmax_adjoint %p, %dp, %delta: score_bar = p (dp - delta)
// CHECK-NEXT:         b_score_bar = b_p * (b_dp - b_delta)
// CHECK-NEXT:         # %x_bar = k3s.rms_score_adjoint %x, %q, %score, %score_bar <eps = 1.0e-06>: x_bar = score_bar (q - score x / (D rms)) / rms, x / rms as (x / s) / (rms / s)
// CHECK-NEXT:         b_scale = tl.minimum(tl.maximum(tl.max(tl.abs(b_x)), 0.001), 8.507059173023462e+37)
// CHECK-NEXT:         b_inverse_scale = 1.0 / b_scale
// CHECK-NEXT:         b_scaled_row = b_x * b_inverse_scale
// CHECK-NEXT:         b_scaled_root_eps = 0.001 * b_inverse_scale
// CHECK-NEXT:         b_scaled_rms = tl.sqrt(tl.sum(b_scaled_row * b_scaled_row) / D + b_scaled_root_eps * b_scaled_root_eps)
// CHECK-NEXT:         b_x_bar = b_score_bar / (b_scale * b_scaled_rms) * (b_q - b_score / D * (b_scaled_row / b_scaled_rms))
// CHECK-NEXT:         # %x_bar = k3s.mix_adjoint %x_bar, %p, %dout: x_bar += p dh
// CHECK-NEXT:         b_x_bar = b_x_bar + b_p * b_dout
// CHECK-NEXT:         # k3s.store_source_cotangent %x_bar, %dsources
// CHECK-NEXT:         tl.store(dsources + (i_s * R + i_r) * D + o_d, b_x_bar.to(dsources.dtype.element_ty), mask=m_d)
// CHECK-NEXT:         # %q_bar, %k_mean, %score_bar_sum = k3s.query_adjoint %x, %p, %score_bar, %q_bar, %k_mean, %score_bar_sum <eps = 1.0e-06>: k = x / rms = (x / s) / (rms / s): q_bar += score_bar k, kbar += p k, sigma += score_bar
// CHECK-NEXT:         b_scale = tl.minimum(tl.maximum(tl.max(tl.abs(b_x)), 0.001), 8.507059173023462e+37)
// CHECK-NEXT:         b_inverse_scale = 1.0 / b_scale
// CHECK-NEXT:         b_scaled_row = b_x * b_inverse_scale
// CHECK-NEXT:         b_scaled_root_eps = 0.001 * b_inverse_scale
// CHECK-NEXT:         b_scaled_rms = tl.sqrt(tl.sum(b_scaled_row * b_scaled_row) / D + b_scaled_root_eps * b_scaled_root_eps)
// CHECK-NEXT:         b_k = b_scaled_row / b_scaled_rms
// CHECK-NEXT:         b_q_bar = b_q_bar + b_score_bar * b_k
// CHECK-NEXT:         b_k_mean = b_k_mean + b_p * b_k
// CHECK-NEXT:         b_score_bar_sum = b_score_bar_sum + b_score_bar
// CHECK-NEXT:     # %q_bar = k3s.recentre_query_adjoint %q_bar, %k_mean, %score_bar_sum: q_bar -= sigma kbar: the scores' cotangents re-centred to sum to zero
// CHECK-NEXT:     b_q_bar = b_q_bar - b_score_bar_sum * b_k_mean
// CHECK-NEXT: # k3s.store_query_cotangent %q_bar, %query, %gain, %dquery, %dgain: q = w * gain: dw += q_bar * gain, dgain += q_bar * w, summed over the programs
// CHECK-NEXT: tl.atomic_add(dquery + o_d, b_q_bar * tl.load(gain + o_d, mask=m_d, other=0.0).to(tl.float32), mask=m_d)
// CHECK-NEXT: tl.atomic_add(dgain + o_d, b_q_bar * tl.load(query + o_d, mask=m_d, other=0.0).to(tl.float32), mask=m_d)
// CHECK-LABEL: def aggregate_backward(sources, query, gain, out, lse, dout):
// CHECK:      _check_tensor("lse", lse, "B,T", "float32", dims, sources.device)
// CHECK:      dsources = _alloc((dims["S"], dims["B"], dims["T"], 7168), sources.dtype, sources.device)
// CHECK-NEXT: dquery = torch.full((7168,), 0, dtype=torch.float32, device=sources.device)
// CHECK-NEXT: dgain = torch.full((7168,), 0, dtype=torch.float32, device=sources.device)
// CHECK-NEXT: # k3s.kernel @attnres_aggregate_backward <grid = [row_group], num_warps = 16, num_stages = 3, block_d = 8192, launch_params = [S, R]>: launch
// CHECK:      BR = 16
// CHECK-NEXT: grid = (triton.cdiv(dims["B"] * dims["T"], BR),)
// CHECK:      return dsources, dquery, dgain
// CHECK:      __all__ = ['aggregate', 'aggregate_backward', 'block_partials', 'block_merge', 'block_partials_backward', 'block_merge_backward']
