// derive-block-attnres-backward's phase 1 backward with partials-backward=columns: a program's
// group of token rows with all the call's queries (grid row_group_all_queries; the fold's queries = 0,
// BQ the next power of two of the call's Q) and all of a row's representatives (<S x ..> tiles,
// k3s.load_source_columns <sources = num_blocks>), the hidden columns in blocks (k3s.column_loop,
// <D> the block's columns). Sweep 1, per row: the dots q . x, dh . x and the representatives' sums
// of squares over the row's columns (k3s.column_dots, carried by the column loop; each
// representative and d mix row read once), the row's coefficients (k3s.sources_score_adjoint: delta
// from the representatives, block_mix never read) to fp32 workspaces. Then a barrier; sweep 2, per
// block of columns over the program's rows: the coefficients back, the representatives and d mixes
// read again, the representatives' cotangents stored once in their dtype (no fill, no atomics) and
// the queries' summed over the rows, added by the fold's adjoint per block of columns.
// RUN: k3c opt %s -p 'derive-block-attnres-backward{partials-backward=columns}' | filecheck %s
// RUN: k3c opt %s -p 'derive-block-attnres-backward{partials-backward=columns}' | k3c opt - | filecheck %s
// RUN: k3c opt %s -p 'derive-block-attnres-backward{partials-backward=columns}' --generic | k3c opt - | filecheck %s
// Options: the columns of a block (at most the row's padded width), rows a program, warps.
// RUN: k3c opt %s -p 'derive-block-attnres-backward{partials-backward=columns block-columns=16 rows-per-program=3 num-warps=4}' | filecheck %s --check-prefix=OPTS
// RUN: k3c opt %s -p 'derive-block-attnres-backward{partials-backward=columns block-columns=1024}' | filecheck %s --check-prefix=WHOLE
// RUN: not k3c opt %s -p 'derive-block-attnres-backward{partials-backward=columns block-columns=48}' 2>&1 | filecheck %s --check-prefix=POW2
// RUN: not k3c opt %s -p 'derive-block-attnres-backward{partials-backward=rows}' 2>&1 | filecheck %s --check-prefix=FORM
// The new stages verify their tiles (one line each).
// RUN: k3c opt %s -p 'derive-block-attnres-backward{partials-backward=columns}' | sed 's/%%x = k3s.load_source_columns %%representatives <sources = 6> : !k3s.tile<S x D>/%%x = k3s.load_source_columns %%representatives <sources = 6> : !k3s.tile<Q x D>/' | not k3c opt - 2>&1 | filecheck %s --check-prefix=ROWS
// RUN: k3c opt %s -p 'derive-block-attnres-backward{partials-backward=columns}' | sed 's/%%t_1, %%c_1 :/%%t_1, %%t_1 :/' | not k3c opt - 2>&1 | filecheck %s --check-prefix=CENTRE
// RUN: k3c opt %s -p 'derive-block-attnres-backward{partials-backward=columns}' | sed 's/%%sum_sq = k3s.zeros : !k3s.tile<S>/%%sum_sq = k3s.zeros : !k3s.tile<S x Q>/' | not k3c opt - 2>&1 | filecheck %s --check-prefix=CARRIED
// The example spec (K3's width) printed with this form: blocks of 64 columns, 8 representatives, BQ from the call.
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
// CHECK-NEXT: %weights = k3s.tensor_arg @weights <role = workspace> : !k3s.tensor<S x B x T x Q, float32>
// CHECK-NEXT: %score_bars = k3s.tensor_arg @score_bars <role = workspace> : !k3s.tensor<S x B x T x Q, float32>
// CHECK-NEXT: %centres = k3s.tensor_arg @centres <role = workspace> : !k3s.tensor<S x B x T, float32>
// CHECK-NEXT: k3s.kernel @ar_block_partials_backward_columns <grid = [row_group_all_queries], num_warps = 8> {
// CHECK-NEXT: k3s.row_loop <rows = 16> {
// CHECK-NEXT: %lse = k3s.load_query_rows %block_lse : !k3s.tile<Q>
// CHECK-NEXT: %lse_bar = k3s.load_query_rows %dblock_lse : !k3s.tile<Q>
// CHECK-NEXT: %scale = k3s.zeros : !k3s.tile<S>
// CHECK-NEXT: %sum_sq = k3s.zeros : !k3s.tile<S>
// CHECK-NEXT: %qx = k3s.zeros : !k3s.tile<S x Q>
// CHECK-NEXT: %dp = k3s.zeros : !k3s.tile<S x Q>
// CHECK-NEXT: %scale_1, %sum_sq_1, %qx_1, %dp_1 = k3s.column_loop %scale, %sum_sq, %qx, %dp <columns = 64> {
// CHECK-NEXT: ^bb0(%scale_2: !k3s.tile<S>, %sum_sq_2: !k3s.tile<S>, %qx_2: !k3s.tile<S x Q>, %dp_2: !k3s.tile<S x Q>):
// CHECK-NEXT: %q = k3s.fold_query %queries, %gains <hidden_size = 96, queries = 0> : !k3s.tile<Q x D>
// CHECK-NEXT: %dout = k3s.load_query_rows %dblock_mix : !k3s.tile<Q x D>
// CHECK-NEXT: %x = k3s.load_source_columns %representatives <sources = 6> : !k3s.tile<S x D>
// CHECK-NEXT: %scale_3, %sum_sq_3, %qx_3, %dp_3 = k3s.column_dots %x, %q, %dout, %scale_2, %sum_sq_2, %qx_2, %dp_2 <eps = 0.0001> : !k3s.tile<S>, !k3s.tile<S>, !k3s.tile<S x Q>, !k3s.tile<S x Q>
// CHECK-NEXT: k3s.next_column %scale_3, %sum_sq_3, %qx_3, %dp_3
// CHECK-NEXT: } : !k3s.tile<S>, !k3s.tile<S>, !k3s.tile<S x Q>, !k3s.tile<S x Q>
// CHECK-NEXT: %p, %t, %c = k3s.sources_score_adjoint %scale_1, %sum_sq_1, %qx_1, %dp_1, %lse, %lse_bar <eps = 0.0001> : !k3s.tile<S x Q>, !k3s.tile<S x Q>, !k3s.tile<S>
// CHECK-NEXT: k3s.store_row_coefficients %p, %t, %c, %weights, %score_bars, %centres
// CHECK-NEXT: k3s.next_row
// CHECK-NEXT: }
// CHECK-NEXT: k3s.program_barrier
// CHECK-NEXT: k3s.column_loop <columns = 64> {
// CHECK-NEXT: %q_1 = k3s.fold_query %queries, %gains <hidden_size = 96, queries = 0> : !k3s.tile<Q x D>
// CHECK-NEXT: %q_bar = k3s.zeros : !k3s.tile<Q x D>
// CHECK-NEXT: %q_bar_1 = k3s.row_loop %q_bar <rows = 16> {
// CHECK-NEXT: ^bb0(%q_bar_2: !k3s.tile<Q x D>):
// CHECK-NEXT: %p_1, %t_1, %c_1 = k3s.load_row_coefficients %weights, %score_bars, %centres : !k3s.tile<S x Q>, !k3s.tile<S x Q>, !k3s.tile<S>
// CHECK-NEXT: %dout_1 = k3s.load_query_rows %dblock_mix : !k3s.tile<Q x D>
// CHECK-NEXT: %x_1 = k3s.load_source_columns %representatives <sources = 6> : !k3s.tile<S x D>
// CHECK-NEXT: %x_bar = k3s.sources_adjoint %x_1, %q_1, %dout_1, %p_1, %t_1, %c_1 : !k3s.tile<S x D>
// CHECK-NEXT: k3s.store_source_columns %x_bar, %drepresentatives
// CHECK-NEXT: %q_bar_3 = k3s.sources_query_adjoint %x_1, %t_1, %q_bar_2 : !k3s.tile<Q x D>
// CHECK-NEXT: k3s.next_row %q_bar_3
// CHECK-NEXT: } : !k3s.tile<Q x D>
// CHECK-NEXT: k3s.store_query_cotangent %q_bar_1, %queries, %gains, %dqueries, %dgains
// CHECK-NEXT: k3s.next_column

// CHECK:      k3s.entry @block_merge_backward <source = @ar, max_sources = 1> {

// OPTS:       k3s.kernel @ar_block_partials_backward_columns <grid = [row_group_all_queries], num_warps = 4> {
// OPTS-NEXT:    k3s.row_loop <rows = 3> {
// OPTS:         k3s.column_loop %scale, %sum_sq, %qx, %dp <columns = 16> {
// OPTS:       k3s.column_loop <columns = 16> {
// OPTS-NEXT:    %q_1 = k3s.fold_query
// OPTS-NEXT:    %q_bar = k3s.zeros
// OPTS-NEXT:    %q_bar_1 = k3s.row_loop %q_bar <rows = 3> {

// WHOLE:      k3s.column_loop %scale, %sum_sq, %qx, %dp <columns = 128> {
// WHOLE:      k3s.column_loop <columns = 128> {

// POW2:       derive-block-attnres-backward: block-columns must be a power of two, got 48
// FORM:       derive-block-attnres-backward: partials-backward must be one of query-blocks, columns, got rows
// ROWS:       k3s.load_source_columns: the rows must be <S x D>, got <Q x D>
// CENTRE:     k3s.sources_adjoint: c must be <S>, got <S x Q>
// CARRIED:    k3s.column_loop: the column loop's initial values, block arguments and results must have the same types

// TRITON-LABEL: def attnres_block_partials_backward_columns_kernel(
// TRITON:         # grid axis 0: a group of BR token rows, with all Q queries and all S representatives of a row
// TRITON:         for i_r in range(i_rg * BR, tl.minimum(i_rg * BR + BR, R)):
// TRITON:             for i_c in range(0, D, BD):
// TRITON-NEXT:            o_d = i_c + tl.arange(0, BD)
// TRITON:                 b_x = tl.load(representatives + (o_s[:, None] * R + i_r) * D + o_d[None, :], mask=m_sd, other=0.0).to(tl.float32)
// TRITON:                 b_qx = b_qx + tl.sum(b_x[:, None, :] * b_q[None, :, :], axis=2)
// TRITON-NEXT:            b_dp = b_dp + tl.sum(b_x[:, None, :] * b_dout[None, :, :], axis=2)
// TRITON:             b_delta = tl.sum(b_p * b_dp, axis=0)
// TRITON:         tl.debug_barrier()
// TRITON-NEXT:    # k3s.column_loop <columns = 64>: the hidden columns in blocks of BD
// TRITON-NEXT:    for i_c in range(0, D, BD):
// TRITON:             for i_r in range(i_rg * BR, tl.minimum(i_rg * BR + BR, R)):
// TRITON:                 tl.store(drepresentatives + (o_s[:, None] * R + i_r) * D + o_d[None, :], b_x_bar.to(drepresentatives.dtype.element_ty), mask=m_sd)
// TRITON:             tl.atomic_add(dqueries + o_q[:, None] * D + o_d[None, :]
// TRITON-LABEL: def block_partials_backward(
// TRITON:         drepresentatives = _alloc((dims["S"], dims["B"], dims["T"], 7168), representatives.dtype, representatives.device)
// TRITON:         BD = 64
// TRITON-NEXT:    D = 7168
// TRITON-NEXT:    BQ = triton.next_power_of_2(dims["Q"])
// TRITON-NEXT:    BS = 8
// TRITON-NEXT:    grid = (triton.cdiv(dims["B"] * dims["T"], BR),)
