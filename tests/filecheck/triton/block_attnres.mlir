// The printed Triton of Block AttnRes's two phases (derive-block-attnres; k3c compile --stdout):
// with partials-schedule=query-blocks, block_partials is one program per token row and block of BQ of
// the block's queries that folds its queries, reads each representative row once for all of them
// ([BQ] scores and softmax, a [BQ, BD] mix: the <Q> tiles broadcast against the row) and stores
// the partials normalised (the log-sum-exp, the mix over the normaliser in the activations'
// dtype); block_merge, the aggregate's kernel resuming its loop from one query's state (lse, 1, mix).
// RUN: k3c compile %examples/attnres.toml --stdout --no-autotune -p 'fuse-attnres,derive-attnres-backward,derive-block-attnres{partials-schedule=query-blocks},outline-kernels' | filecheck %s
// block_partials with partials-schedule=columns (an option until timed on a GPU): a fold kernel (the queries once a call,
// in two parts of the activations' dtype), then a program per group of BR rows with all queries
// and representatives: the first sweep's products on tl.dot (the Gram matrix, the queries'
// dots), the softmax between the sweeps, the second sweep last block first writing the mixes.
// RUN: k3c compile %examples/attnres.toml --stdout --no-autotune -p 'fuse-attnres,derive-attnres-backward,derive-block-attnres{partials-schedule=columns},outline-kernels' | filecheck %s --check-prefix=COLUMNS
// derive-block-attnres{partials-schedule=query-blocks partials=numerator} stores each query's running max, normaliser and
// un-normalised mix as the loop carries them, fp32; block_merge resumes from (m, z, a).
// RUN: k3c compile %examples/attnres.toml --stdout --no-autotune -p 'fuse-attnres,derive-attnres-backward,derive-block-attnres{partials-schedule=query-blocks partials=numerator},outline-kernels' | filecheck %s --check-prefix=NUMERATOR
// With derive-block-attnres{partials-schedule=query-blocks rows-per-program=8}, block_partials takes a group of BR rows for its
// block of queries: it folds them once and walks the group's (row, representative) pairs as one
// pipelined loop, the softmax restarted at each row's first source and the partials stored at
// its last; block_merge takes a group of rows for its query, each row resumed from its partials.
// RUN: k3c compile %examples/attnres.toml --stdout --no-autotune -p 'fuse-attnres,derive-attnres-backward,derive-block-attnres{partials-schedule=query-blocks rows-per-program=8},outline-kernels' | filecheck %s --check-prefix=GROUPS

// CHECK-LABEL: def attnres_block_partials_kernel(
// CHECK:      Q,
// CHECK:      BQ: tl.constexpr,
// CHECK:      # grid axis 0: one token row and a block of BQ of its Q queries; a row's blocks are adjacent
// CHECK:      i_r = i_rq // tl.cdiv(Q, BQ)
// CHECK-NEXT: o_q = (i_rq % tl.cdiv(Q, BQ)) * BQ + tl.arange(0, BQ)
// CHECK-NEXT: m_q = o_q < Q
// CHECK:      m_qd = m_q[:, None] & m_d[None, :]
// CHECK-NEXT: # %q = k3s.fold_query %queries, %gains <hidden_size = 7168, queries = 2>: RMSNorm gains folded into the program's block of the pseudo-queries
// CHECK-NEXT: b_q = tl.load(queries + o_q[:, None] * D + o_d[None, :], mask=m_qd, other=0.0).to(tl.float32) * tl.load(gains + o_q[:, None] * D + o_d[None, :], mask=m_qd, other=0.0).to(tl.float32)
// CHECK-NEXT: # %max, %sum, %acc = k3s.softmax_start: the online softmax before any source
// CHECK-NEXT: b_max = tl.full([BQ], float("-inf"), dtype=tl.float32)
// CHECK-NEXT: b_sum = tl.zeros([BQ], dtype=tl.float32)
// CHECK-NEXT: b_acc = tl.zeros([BQ, BD], dtype=tl.float32)
// CHECK-NEXT: # %max, %sum, %acc = k3s.source_loop %max, %sum, %acc: each source row is read once
// CHECK-NEXT: for i_s in tl.range(0, S, num_stages=3):
// CHECK-NEXT:     b_x = tl.load(representatives + (i_s * R + i_r) * D + o_d, mask=m_d, other=0.0).to(tl.float32)
// CHECK-NEXT:     # %score = k3s.rms_score %x, %q <eps = 1.0e-06>: score = q . x / rms(x), as q . (x / s) / (rms(x) / s)
// CHECK-NEXT:     b_scale = tl.minimum(tl.maximum(tl.max(tl.abs(b_x)), 0.001), 8.507059173023462e+37)
// CHECK-NEXT:     b_inverse_scale = 1.0 / b_scale
// CHECK-NEXT:     b_scaled_row = b_x * b_inverse_scale
// CHECK-NEXT:     b_scaled_root_eps = 0.001 * b_inverse_scale
// CHECK-NEXT:     b_scaled_rms = tl.sqrt(tl.sum(b_scaled_row * b_scaled_row) / D + b_scaled_root_eps * b_scaled_root_eps)
// CHECK-NEXT:     b_score = tl.sum(b_scaled_row[None, :] * b_q, axis=1) / b_scaled_rms
// CHECK:          b_acc = b_acc * b_rescale[:, None] + b_p[:, None] * b_x[None, :]
// CHECK-NEXT: # k3s.store_normalised_partials %max, %sum, %acc, %block_lse, %block_mix: {{.*}}
// CHECK-NEXT: tl.store(block_lse + o_q * R + i_r, b_max + tl.log(b_sum), mask=m_q)
// CHECK-NEXT: tl.store(block_mix + (o_q[:, None] * R + i_r) * D + o_d[None, :], (b_acc / b_sum[:, None]).to(block_mix.dtype.element_ty), mask=m_qd)

// CHECK-LABEL: def block_partials(representatives, queries, gains):
// CHECK:      if not 1 <= dims["S"] <= 8:
// CHECK:      block_mix = _alloc((dims["Q"], dims["B"], dims["T"], 7168), representatives.dtype, representatives.device)
// CHECK:      BQ = 2
// CHECK-NEXT: grid = (dims["B"] * dims["T"] * triton.cdiv(dims["Q"], BQ),)
// CHECK:      num_warps=16,
// CHECK:      return block_lse, block_mix

// CHECK-LABEL: def attnres_block_merge_kernel(
// CHECK:      # %max, %sum, %acc = k3s.load_normalised_partials %block_lse, %block_mix: {{.*}}
// CHECK-NEXT: b_max = tl.load(block_lse + i_r)
// CHECK-NEXT: b_sum = tl.full([], 1.0, dtype=tl.float32)
// CHECK-NEXT: b_acc = tl.load(block_mix + i_r * D + o_d, mask=m_d, other=0.0).to(tl.float32)
// CHECK-NEXT: # %max, %sum, %acc = k3s.source_loop %max, %sum, %acc: each source row is read once
// CHECK-NEXT: for i_s in range(0, S):
// CHECK-NEXT:     b_x = tl.load(partial_sum + (i_s * R + i_r) * D + o_d, mask=m_d, other=0.0).to(tl.float32)
// CHECK:          b_acc = b_acc * b_rescale + b_p * b_x
// CHECK-NEXT: # k3s.normalize_store %acc, %sum, %out
// CHECK-NEXT: tl.store(out + i_r * D + o_d, (b_acc / b_sum).to(out.dtype.element_ty), mask=m_d)

// CHECK-LABEL: def block_merge(partial_sum, query, gain, block_lse, block_mix, output_lse=False):
// CHECK:      _check_tensor("block_mix", block_mix, "B,T,7168", "float", dims, partial_sum.device)
// CHECK:      if not 1 <= dims["S"] <= 1:
// CHECK:      return out, lse

// NUMERATOR-LABEL: def attnres_block_partials_kernel(
// NUMERATOR:      # k3s.store_partials %max, %sum, %acc, %block_max, %block_normaliser, %block_numerator: {{.*}}
// NUMERATOR-NEXT: tl.store(block_max + o_q * R + i_r, b_max, mask=m_q)
// NUMERATOR-NEXT: tl.store(block_normaliser + o_q * R + i_r, b_sum, mask=m_q)
// NUMERATOR-NEXT: tl.store(block_numerator + (o_q[:, None] * R + i_r) * D + o_d[None, :], b_acc, mask=m_qd)
// NUMERATOR-LABEL: def block_partials(representatives, queries, gains):
// NUMERATOR:      block_numerator = _alloc((dims["Q"], dims["B"], dims["T"], 7168), torch.float32, representatives.device)
// NUMERATOR:      return block_max, block_normaliser, block_numerator
// NUMERATOR-LABEL: def attnres_block_merge_kernel(
// NUMERATOR:      # %max, %sum, %acc = k3s.load_partials %block_max, %block_normaliser, %block_numerator: {{.*}}
// NUMERATOR-NEXT: b_max = tl.load(block_max + i_r)
// NUMERATOR-NEXT: b_sum = tl.load(block_normaliser + i_r)
// NUMERATOR-NEXT: b_acc = tl.load(block_numerator + i_r * D + o_d, mask=m_d, other=0.0)
// NUMERATOR-LABEL: def block_merge(partial_sum, query, gain, block_max, block_normaliser, block_numerator, output_lse=False):
// NUMERATOR:      _check_tensor("block_numerator", block_numerator, "B,T,7168", "float32", dims, partial_sum.device)

// GROUPS-LABEL: def attnres_block_partials_groups_kernel(
// GROUPS:      # grid axis 0: a group of BR token rows and a block of BQ of the Q queries; a group's blocks
// GROUPS:      i_rg = i_rgq // tl.cdiv(Q, BQ)
// GROUPS-NEXT: o_q = (i_rgq % tl.cdiv(Q, BQ)) * BQ + tl.arange(0, BQ)
// GROUPS:      # %max, %sum, %acc = k3s.row_source_loop %max, %sum, %acc <rows = 8>: {{.*}}
// GROUPS-NEXT: for i_rs in tl.range(i_rg * BR * S, tl.minimum(i_rg * BR + BR, R) * S, num_stages=4):
// GROUPS-NEXT:     i_r = i_rs // S
// GROUPS-NEXT:     i_s = i_rs % S
// GROUPS-NEXT:     # %max = k3s.row_start %max: a row's first source starts the online softmax anew
// GROUPS-NEXT:     b_max = tl.where(i_s == 0, float("-inf"), b_max)
// GROUPS:          b_acc = b_acc * b_rescale[:, None] + b_p[:, None] * b_x[None, :]
// GROUPS-NEXT:     # k3s.at_row_end: after the row's last source
// GROUPS-NEXT:     if i_s == S - 1:
// GROUPS-NEXT:         # k3s.store_normalised_partials %max, %sum, %acc, %block_lse, %block_mix: {{.*}}
// GROUPS-NEXT:         tl.store(block_lse + o_q * R + i_r, b_max + tl.log(b_sum), mask=m_q)
// GROUPS-LABEL: def block_partials(representatives, queries, gains):
// GROUPS:      if all(grid) and dims["B"] * dims["T"] <= 2047:
// GROUPS:      BQ = 2
// GROUPS-NEXT: BR = 8
// GROUPS-NEXT: grid = (triton.cdiv(dims["B"] * dims["T"], BR) * triton.cdiv(dims["Q"], BQ),)
// GROUPS-NEXT: if all(grid) and dims["B"] * dims["T"] >= 2048:
// GROUPS-LABEL: def attnres_block_merge_groups_kernel(
// GROUPS:      b_row_max = tl.load(block_lse + i_r)
// GROUPS-NEXT: b_row_sum = tl.full([], 1.0, dtype=tl.float32)
// GROUPS-NEXT: b_row_acc = tl.load(block_mix + i_r * D + o_d, mask=m_d, other=0.0).to(tl.float32)
// GROUPS-NEXT: # %max, %sum, %acc = k3s.row_resume {{.*}}
// GROUPS-NEXT: b_max = tl.where(i_s == 0, b_row_max, b_max)
// GROUPS-NEXT: b_sum = tl.where(i_s == 0, b_row_sum, b_sum)
// GROUPS-NEXT: b_acc = tl.where(i_s == 0, b_row_acc, b_acc)
// GROUPS-LABEL: def block_merge(partial_sum, query, gain, block_lse, block_mix, output_lse=False):
// GROUPS:      if all(grid) and dims["B"] * dims["T"] <= 2047:
// GROUPS:      grid = (triton.cdiv(dims["B"] * dims["T"], BR),)
// GROUPS-NEXT: if all(grid) and dims["B"] * dims["T"] >= 2048:

// COLUMNS-LABEL: def attnres_block_partials_fold_kernel(
// COLUMNS:       # k3s.fold_queries_split %queries, %gains, %folded
// COLUMNS-LABEL: def attnres_block_partials_columns_kernel(
// COLUMNS:       # grid axis 0: a group of BR token rows, with all Q queries and all S representatives of a row
// COLUMNS:       b_gram = tl.zeros([BR * BS, BR * BS], dtype=tl.float32)
// COLUMNS:       b_qx = tl.zeros([BQ, BR * BS], dtype=tl.float32)
// COLUMNS:       for i_c in tl.range(0, D, BD, num_stages=3):
// COLUMNS:           b_x = tl.load(representatives + (i_sk[:, None] * R + i_rk[:, None]) * D + o_d[None, :], {{.*}}eviction_policy='evict_last')
// COLUMNS:           b_gram = tl.dot(b_x, tl.trans(b_x), b_gram, input_precision="ieee")
// COLUMNS-NEXT:      b_qx = tl.dot(b_q_high, tl.trans(b_x), b_qx, input_precision="ieee")
// COLUMNS:       # %score = k3s.group_scores
// COLUMNS:       # %max, %sum, %p = k3s.group_softmax %score <normalised = true>
// COLUMNS:       tl.store(block_lse + o_q[None, :] * R + i_rg * BR + tl.arange(0, BR)[:, None], b_max + tl.log(b_sum)
// COLUMNS:       # k3s.column_loop <columns = 128, reverse = true>: the hidden columns in blocks of BD, the last block first
// COLUMNS-NEXT:  for i_b in tl.range(0, tl.cdiv(D, BD), num_stages=3):
// COLUMNS-NEXT:      i_c = (tl.cdiv(D, BD) - 1 - i_b) * BD
// COLUMNS:           b_x = tl.load({{.*}}eviction_policy='evict_first')
// COLUMNS:           b_mix = tl.dot(b_p_high, b_x, input_precision="ieee")
// COLUMNS:           tl.store(block_mix + (i_qm[:, None] * R + i_rm[:, None]) * D + o_d[None, :], b_mix.to(block_mix.dtype.element_ty)
// COLUMNS-LABEL: def block_partials(representatives, queries, gains):
// COLUMNS:       folded = _alloc((2, dims["Q"], 7168), representatives.dtype, representatives.device)
// COLUMNS:       grid = (triton.cdiv(DIN, BD),)
// COLUMNS:       attnres_block_partials_fold_kernel[grid](
// COLUMNS:       attnres_block_partials_columns_kernel[grid](
