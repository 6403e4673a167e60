// derive-block-attnres-backward's phase 1 backward with partials-backward=columns: the forward's
// columns form run backwards, three kernels. The call's queries folded once (the forward's fold
// kernel, k3s.fold_queries_split, into the `folded` workspace); then a program per group of
// `columns-rows` token rows (grid row_group_all_queries; raised to 16 (row, representative) pairs,
// tl.dot's least) with all the call's queries (BQ at least 16) and all of a row's representatives,
// the group's rows as tiles, the hidden columns in blocks (k3s.column_loop). Sweep 1: the Gram
// matrix and q . x (k3s.group_column_dots, the forward's) and dh . x (k3s.group_out_bar_dots),
// products of the group's rows; the scores and their RMS (k3s.group_scores with its rho result),
// the saved log-sum-exps and their cotangents (k3s.load_group_stats), the coefficients p, t, c
// (k3s.group_score_adjoint; block_mix never read), t stored to the score_bars workspace, t (over a
// power of two, its scale) and p split in two parts (k3s.split_weights). Sweep 2, last block first: the rows and d mixes read
// again (last use), the representatives' cotangents as products (k3s.group_sources_adjoint)
// stored once in their dtype (k3s.store_group_rows, the forward's: no fill, no atomics). The queries'
// cotangents in a kernel of their own (grid input_block x row_part): t read back with the
// representatives, summed over parts of query-rows token rows (k3s.group_query_cotangent), added
// by the fold's adjoint (k3s.store_query_cotangent, fp32 atomics, once per part and block).
// RUN: k3c opt %s -p 'derive-block-attnres-backward{partials-backward=columns}' | filecheck %s
// RUN: k3c opt %s -p 'derive-block-attnres-backward{partials-backward=columns}' | k3c opt - | filecheck %s
// RUN: k3c opt %s -p 'derive-block-attnres-backward{partials-backward=columns}' --generic | k3c opt - | filecheck %s
// Options: the columns of a block (at most the row's padded width), rows a program (at least 16
// (row, representative) pairs), warps, stages, the queries' kernel's rows a part, columns and pairs.
// RUN: k3c opt %s -p 'derive-block-attnres-backward{partials-backward=columns block-columns=16 columns-rows=8 num-warps=8 num-stages=2 query-rows=64 query-columns=32 query-pairs=16}' | filecheck %s --check-prefix=OPTS
// RUN: k3c opt %s -p 'derive-block-attnres-backward{partials-backward=columns columns-rows=1 block-columns=1024}' | filecheck %s --check-prefix=WHOLE
// RUN: not k3c opt %s -p 'derive-block-attnres-backward{partials-backward=columns block-columns=48}' 2>&1 | filecheck %s --check-prefix=POW2
// RUN: not k3c opt %s -p 'derive-block-attnres-backward{partials-backward=columns block-columns=8}' 2>&1 | filecheck %s --check-prefix=LEAST
// RUN: not k3c opt %s -p 'derive-block-attnres-backward{partials-backward=columns query-pairs=8}' 2>&1 | filecheck %s --check-prefix=PAIRS
// RUN: not k3c opt %s -p 'derive-block-attnres-backward{partials-backward=columns query-columns=8}' 2>&1 | filecheck %s --check-prefix=QCOLUMNS
// RUN: not k3c opt %s -p 'derive-block-attnres-backward{partials-backward=rows}' 2>&1 | filecheck %s --check-prefix=FORM
// The new stages verify their tiles and sizes (one line each).
// RUN: k3c opt %s -p 'derive-block-attnres-backward{partials-backward=columns}' | sed 's/%%dout = k3s.load_group_rows %%dblock_mix : !k3s.tile<R x Q x D>/%%dout = k3s.load_group_rows %%dblock_mix : !k3s.tile<Q x D>/' | not k3c opt - 2>&1 | filecheck %s --check-prefix=ROWS
// RUN: k3c opt %s -p 'derive-block-attnres-backward{partials-backward=columns}' | sed 's/%%p_low, %%c :/%%p_low, %%lse :/' | not k3c opt - 2>&1 | filecheck %s --check-prefix=CENTRE
// RUN: k3c opt %s -p 'derive-block-attnres-backward{partials-backward=columns}' | sed 's/%%score, %%rho, %%dp_1, %%lse/%%score, %%rho, %%gram_1, %%lse/' | not k3c opt - 2>&1 | filecheck %s --check-prefix=DOTS
// RUN: k3c opt %s -p 'derive-block-attnres-backward{partials-backward=columns}' | sed 's/%%rho = k3s.group_scores \(.*\) : !k3s.tile<R x S x Q>, !k3s.tile<R x S>/%%rho = k3s.group_scores \1 : !k3s.tile<R x S x Q>, !k3s.tile<R x Q>/' | not k3c opt - 2>&1 | filecheck %s --check-prefix=RHO
// RUN: k3c opt %s -p 'derive-block-attnres-backward{partials-backward=columns}' | sed 's/rows = 256, pairs = 64/rows = 256, pairs = 8/' | not k3c opt - 2>&1 | filecheck %s --check-prefix=VPAIRS
// RUN: k3c opt %s -p 'derive-block-attnres-backward{partials-backward=columns}' | sed 's/%%t_high, %%t_low, %%t_scale = k3s.split_weights %%t, %%representatives : !k3s.tile<R x S x Q>, !k3s.tile<R x S x Q>/%%t_high, %%t_low, %%t_scale = k3s.split_weights %%t, %%representatives : !k3s.tile<R x S x Q>, !k3s.tile<R x Q x R x S>/' | not k3c opt - 2>&1 | filecheck %s --check-prefix=SPLIT
// RUN: k3c opt %s -p 'derive-block-attnres-backward{partials-backward=columns}' | sed 's/%%t_low, %%t_scale, %%p_high/%%t_low, %%c, %%p_high/' | not k3c opt - 2>&1 | filecheck %s --check-prefix=SCALE
// RUN: k3c opt %s -p 'derive-block-attnres-backward{partials-backward=columns}' | sed 's/k3s.store_group_rows %%x_bar,/k3s.store_group_rows %%t,/' | not k3c opt - 2>&1 | filecheck %s --check-prefix=STORE
// The example spec (K3's width) printed with this form: blocks of 64 columns, pipelined by the
// kernel's stages, products on tl.dot, no loop over a program's rows.
// RUN: k3c compile %examples/attnres.toml --stdout --no-autotune -p 'fuse-attnres,derive-attnres-backward,derive-block-attnres,derive-block-attnres-backward{partials-backward=columns},outline-kernels' | filecheck %s --check-prefix=TRITON

builtin.module {
  k3.attnres @ar <hidden_size = 96, num_blocks = 6, block_size = 4, eps = 0.0001, dtype = bfloat16>
}

// CHECK:      k3.attnres @ar
// CHECK-NEXT: k3s.entry @block_partials_backward <source = @ar, max_sources = 6> {
// CHECK-NEXT: %representatives = k3s.tensor_arg @representatives <role = input> : !k3s.tensor<S x B x T x 96, float>
// CHECK-NEXT: %queries = k3s.tensor_arg @queries <role = input> : !k3s.tensor<Q x 96, float>
// CHECK-NEXT: %gains = k3s.tensor_arg @gains <role = input> : !k3s.tensor<Q x 96, float>
// CHECK-NEXT: %block_lse = k3s.tensor_arg @block_lse <role = input> : !k3s.tensor<Q x B x T, float32>
// CHECK-NEXT: %block_mix = k3s.tensor_arg @block_mix <role = input> : !k3s.tensor<Q x B x T x 96, float>
// CHECK-NEXT: %dblock_lse = k3s.tensor_arg @dblock_lse <role = input> : !k3s.tensor<Q x B x T, float32>
// CHECK-NEXT: %dblock_mix = k3s.tensor_arg @dblock_mix <role = input> : !k3s.tensor<Q x B x T x 96, float>
// CHECK-NEXT: %drepresentatives = k3s.tensor_arg @drepresentatives <role = output> : !k3s.tensor<S x B x T x 96, float>
// CHECK-NEXT: %dqueries = k3s.tensor_arg @dqueries <role = output, fill = 0> : !k3s.tensor<Q x 96, float32>
// CHECK-NEXT: %dgains = k3s.tensor_arg @dgains <role = output, fill = 0> : !k3s.tensor<Q x 96, float32>
// CHECK-NEXT: %folded = k3s.tensor_arg @folded <role = workspace> : !k3s.tensor<2 x Q x 96, float>
// CHECK-NEXT: %score_bars = k3s.tensor_arg @score_bars <role = workspace> : !k3s.tensor<S x B x T x Q, float32>
// CHECK-NEXT: k3s.kernel @ar_block_partials_backward_fold <grid = [input_block], num_warps = 4, block_d = 128> {
// CHECK-NEXT: k3s.fold_queries_split %queries, %gains, %folded <hidden_size = 96, columns = 128>
// CHECK-NEXT: }
// CHECK-NEXT: k3s.kernel @ar_block_partials_backward_columns <grid = [row_group_all_queries], num_warps = 4, num_stages = 3> {
// CHECK-NEXT: %gram = k3s.zeros : !k3s.tile<R x S x R x S>
// CHECK-NEXT: %qx = k3s.zeros : !k3s.tile<Q x R x S>
// CHECK-NEXT: %dp = k3s.zeros : !k3s.tile<R x Q x R x S>
// CHECK-NEXT: %gram_1, %qx_1, %dp_1 = k3s.column_loop %gram, %qx, %dp <columns = 64> {
// CHECK-NEXT: ^bb0(%gram_2: !k3s.tile<R x S x R x S>, %qx_2: !k3s.tile<Q x R x S>, %dp_2: !k3s.tile<R x Q x R x S>):
// CHECK-NEXT: %x = k3s.load_group_sources %representatives <hidden_size = 96, rows = 4, sources = 6> : !k3s.tile<R x S x D>
// CHECK-NEXT: %q_high, %q_low = k3s.load_folded_queries %folded : !k3s.tile<Q x D>, !k3s.tile<Q x D>
// CHECK-NEXT: %dout = k3s.load_group_rows %dblock_mix : !k3s.tile<R x Q x D>
// CHECK-NEXT: %gram_3, %qx_3 = k3s.group_column_dots %x, %q_high, %q_low, %gram_2, %qx_2 : !k3s.tile<R x S x R x S>, !k3s.tile<Q x R x S>
// CHECK-NEXT: %dp_3 = k3s.group_out_bar_dots %dout, %x, %dp_2 : !k3s.tile<R x Q x R x S>
// CHECK-NEXT: k3s.next_column %gram_3, %qx_3, %dp_3
// CHECK-NEXT: } : !k3s.tile<R x S x R x S>, !k3s.tile<Q x R x S>, !k3s.tile<R x Q x R x S>
// CHECK-NEXT: %score, %rho = k3s.group_scores %gram_1, %qx_1, %representatives, %folded <eps = 0.0001> : !k3s.tile<R x S x Q>, !k3s.tile<R x S>
// CHECK-NEXT: %lse = k3s.load_group_stats %block_lse : !k3s.tile<R x Q>
// CHECK-NEXT: %lse_bar = k3s.load_group_stats %dblock_lse : !k3s.tile<R x Q>
// CHECK-NEXT: %p, %t, %c = k3s.group_score_adjoint %score, %rho, %dp_1, %lse, %lse_bar : !k3s.tile<R x Q x R x S>, !k3s.tile<R x S x Q>, !k3s.tile<R x S>
// CHECK-NEXT: k3s.store_group_score_bars %t, %score_bars
// CHECK-NEXT: %t_high, %t_low, %t_scale = k3s.split_weights %t, %representatives : !k3s.tile<R x S x Q>, !k3s.tile<R x S x Q>, !k3s.tile<>
// CHECK-NEXT: %p_high, %p_low = k3s.split_weights %p, %representatives : !k3s.tile<R x Q x R x S>, !k3s.tile<R x Q x R x S>
// CHECK-NEXT: k3s.column_loop <columns = 64, reverse = true> {
// CHECK-NEXT: %x_1 = k3s.load_group_sources %representatives <hidden_size = 96, rows = 4, sources = 6, last_use = true> : !k3s.tile<R x S x D>
// CHECK-NEXT: %q_high_1, %q_low_1 = k3s.load_folded_queries %folded : !k3s.tile<Q x D>, !k3s.tile<Q x D>
// CHECK-NEXT: %dout_1 = k3s.load_group_rows %dblock_mix <last_use = true> : !k3s.tile<R x Q x D>
// CHECK-NEXT: %x_bar = k3s.group_sources_adjoint %x_1, %q_high_1, %q_low_1, %dout_1, %t_high, %t_low, %t_scale, %p_high, %p_low, %c : !k3s.tile<R x S x D>
// CHECK-NEXT: k3s.store_group_rows %x_bar, %drepresentatives
// CHECK-NEXT: k3s.next_column
// CHECK-NEXT: }
// CHECK-NEXT: }
// CHECK-NEXT: k3s.kernel @ar_block_partials_backward_queries <grid = [input_block, row_part], num_warps = 4, num_stages = 3> {
// CHECK-NEXT: %q_bar = k3s.group_query_cotangent %score_bars, %representatives <hidden_size = 96, columns = 128, rows = 256, pairs = 64> : !k3s.tile<Q x D>
// CHECK-NEXT: k3s.store_query_cotangent %q_bar, %queries, %gains, %dqueries, %dgains
// CHECK-NEXT: }
// CHECK-NEXT: }
// CHECK-NEXT: k3s.entry @block_merge_backward <source = @ar, max_sources = 1> {

// OPTS:       k3s.kernel @ar_block_partials_backward_columns <grid = [row_group_all_queries], num_warps = 8, num_stages = 2> {
// OPTS:         k3s.column_loop %gram, %qx, %dp <columns = 16> {
// OPTS-NEXT:    ^bb0
// OPTS-NEXT:    k3s.load_group_sources %representatives <hidden_size = 96, rows = 8, sources = 6>
// OPTS:         k3s.column_loop <columns = 16, reverse = true> {
// OPTS:       k3s.kernel @ar_block_partials_backward_queries <grid = [input_block, row_part], num_warps = 4, num_stages = 2> {
// OPTS-NEXT:    k3s.group_query_cotangent %score_bars, %representatives <hidden_size = 96, columns = 32, rows = 64, pairs = 16>

// WHOLE:      k3s.column_loop %gram, %qx, %dp <columns = 128> {
// WHOLE-NEXT: ^bb0
// WHOLE-NEXT: k3s.load_group_sources %representatives <hidden_size = 96, rows = 2, sources = 6>
// WHOLE:      k3s.column_loop <columns = 128, reverse = true> {

// POW2:       derive-block-attnres-backward: block-columns must be a power of two, got 48
// LEAST:      derive-block-attnres-backward: block-columns must be at least 16 (tl.dot's least), got 8
// PAIRS:      derive-block-attnres-backward: query-pairs must be at least 16 (tl.dot's least) and at most query-rows, got 8 (query-rows 256)
// QCOLUMNS:   derive-block-attnres-backward: query-columns must be at least 16 (tl.dot's least), got 8
// FORM:       derive-block-attnres-backward: partials-backward must be one of query-blocks, columns, got rows
// ROWS:       k3s.load_group_rows: the rows must be <R x Q x D>, got <Q x D>
// CENTRE:     k3s.group_sources_adjoint: c must be <R x S>, got <R x Q>
// DOTS:       k3s.group_score_adjoint: dh . x must be <R x Q x R x S>, got <R x S x R x S>
// RHO:        k3s.group_scores: the RMS must be <R x S>, got <R x Q>
// VPAIRS:     k3s.group_query_cotangent: columns and pairs must be powers of two, pairs at least 16 (tl.dot's least) and rows a multiple of pairs; got columns = 128, rows = 256, pairs = 8
// STORE:      k3s.store_group_rows: the rows must be <R x Q x D> or <R x S x D>, got <R x S x Q>
// SCALE:      k3s.group_sources_adjoint: t's scale must be <>, got <R x S>
// SPLIT:      k3s.split_weights: the low part must be <R x S x Q>, got <R x Q x R x S>

// TRITON-LABEL: def attnres_block_partials_backward_fold_kernel(
// TRITON-LABEL: def attnres_block_partials_backward_columns_kernel(
// TRITON:         # grid axis 0: a group of BR token rows, with all Q queries and all S representatives of a row
// TRITON-NOT:     for i_r in
// TRITON:         for i_c in tl.range(0, D, BD, num_stages=3):
// TRITON:             b_gram = tl.dot(b_x, tl.trans(b_x), b_gram, input_precision="ieee")
// TRITON:             b_dp = tl.dot(b_dout, tl.trans(b_x), b_dp, input_precision="ieee")
// TRITON:         b_rho = b_rms
// TRITON:         tl.store(score_bars + (i_sk[:, None] * R + i_rk[:, None]) * Q + o_q[None, :], b_t, mask=m_k[:, None] & m_q[None, :])
// TRITON:         b_t_scale = tl.exp2(tl.ceil(tl.log2(tl.maximum(tl.max(tl.abs(b_t)), 7.888609052210118e-31))))
// TRITON-NEXT:    b_in_range = b_t / b_t_scale
// TRITON:         for i_b in tl.range(0, tl.cdiv(D, BD), num_stages=3):
// TRITON:             b_x_bar = tl.dot(b_t_high, b_q_high, input_precision="ieee")
// TRITON:             b_x_bar = tl.dot(tl.trans(b_p_high), b_dout, b_x_bar * b_t_scale, input_precision="ieee")
// TRITON:             tl.store(drepresentatives + (i_sk[:, None] * R + i_rk[:, None]) * D + o_d[None, :], b_x_bar.to(drepresentatives.dtype.element_ty), mask=m_k[:, None] & m_d[None, :], eviction_policy="evict_first")
// TRITON-NOT:     tl.atomic_add
// TRITON-LABEL: def attnres_block_partials_backward_queries_kernel(
// TRITON:         for i_j in tl.range(0, S * (BR // BK), num_stages=3):
// TRITON:             b_t = b_t / b_t_scale
// TRITON:             b_part = tl.dot(tl.trans(b_t_high), b_x, input_precision="ieee")
// TRITON:             b_q_bar = b_q_bar + b_part * b_t_scale
// TRITON:         tl.atomic_add(dqueries + o_q[:, None] * D + o_d[None, :]
// TRITON-LABEL: def block_partials_backward(
// TRITON:         drepresentatives = _alloc((dims["S"], dims["B"], dims["T"], 7168), representatives.dtype, representatives.device)
// TRITON:         grid = (triton.cdiv(dims["B"] * dims["T"], BR),)
// TRITON:         BD = 128
// TRITON-NEXT:    BR = 256
// TRITON:         grid = (triton.cdiv(DIN, BD), triton.cdiv(dims["B"] * dims["T"], BR))
