// derive-block-attnres-backward: the attnres op stays and two entries are added after it, the
// backward of Block AttnRes's two phases, each derive-attnres-backward's aggregate backward
// kernel split where derive-block-attnres splits the aggregate (phase 1's as the option
// partials-backward=query-blocks here; the default, in blocks of columns, in
// derive_block_attnres_backward_columns.mlir):
// - block_partials_backward: the aggregate backward batched over the program's block of queries
//   (grid row_group_query_block): the saved log-sum-exp, output and its cotangent are the block's
//   rows of block_lse, block_mix and dblock_mix (k3s.load_query_rows); every value of them or of
//   the folded query gets the tile dimension Q, a representative's row does not (read once for
//   the program's queries), and its cotangent sums the queries' terms (rms_score_adjoint and
//   mix_adjoint to a <D> tile) and is added into the zero-filled fp32 drepresentatives
//   (k3s.add_source_cotangent: the row's other blocks of queries add theirs); the log-sum-exp's
//   cotangent is taken from delta and starts the scores' cotangents' sum at -lse_bar
//   (k3s.lse_adjoint); dqueries and dgains by the fold's adjoint, [Q, D] fp32.
// - block_merge_backward: the aggregate backward over the one source, the partial sum, with the
//   partials as the softmax's first source: before the loop their weight alpha = exp(L_p - L)
//   (L the merge's saved log-sum-exp) and score cotangent (k3s.partials_adjoint), which starts
//   the loop's sum sigma; after it the query's re-centring and the partials' cotangents
//   (k3s.store_partials_cotangent: lse_bar - alpha sigma, alpha dh). Nothing to pipeline.
// RUN: k3c opt %s -p 'derive-block-attnres-backward{partials-backward=query-blocks}' | filecheck %s
// RUN: k3c opt %s -p 'derive-block-attnres-backward{partials-backward=query-blocks}' | k3c opt - | filecheck %s
// RUN: k3c opt %s -p 'derive-block-attnres-backward{partials-backward=query-blocks}' --generic | k3c opt - | filecheck %s
// In the default pipeline's order the backward entries follow the forward phases; running the pass again adds nothing.
// RUN: k3c opt %s -p fuse-attnres,derive-attnres-backward,derive-block-attnres,derive-block-attnres-backward,derive-block-attnres-backward | filecheck %s --check-prefix=ORDER
// The program's block of queries: by default the most (at most 32) whose 4 BQ + 2 rows fit
// derive-block-attnres's budget (six rows of 8192 fp32); a row of 9000 columns leaves one, in
// 32 warps. Options: the block, the rows a program takes, warps.
// RUN: k3c opt %s -p 'derive-block-attnres-backward{partials-backward=query-blocks queries-per-program=2 rows-per-program=4 num-warps=8}' | filecheck %s --check-prefix=OPTS
// RUN: k3c opt %s -p 'derive-block-attnres-backward{partials-backward=query-blocks}' | filecheck %s --check-prefix=WIDE
// RUN: not k3c opt %s -p 'derive-block-attnres-backward{queries-per-program=3}' 2>&1 | filecheck %s --check-prefix=POW2
// RUN: not k3c opt %s -p 'derive-block-attnres-backward{rows-per-program=0}' 2>&1 | filecheck %s --check-prefix=ROWS0
// RUN: not k3c opt %s -p 'derive-block-attnres-backward{num-stages=0}' 2>&1 | filecheck %s --check-prefix=STAGES
// Only the normalised partials have a backward.
// RUN: not k3c opt %s -p 'derive-block-attnres{partials=numerator},derive-block-attnres-backward' 2>&1 | filecheck %s --check-prefix=NUMERATOR
// The new stages verify their tiles and tensors (one line each).
// RUN: k3c opt %s -p 'derive-block-attnres-backward{partials-backward=query-blocks}' | sed 's/%%dout = k3s.load_query_rows %%dblock_mix : !k3s.tile<Q x D>/%%dout = k3s.load_query_rows %%dblock_mix : !k3s.tile<Q>/' | not k3c opt - 2>&1 | filecheck %s --check-prefix=ROWS
// RUN: k3c opt %s -p 'derive-block-attnres-backward{partials-backward=query-blocks}' | sed 's/k3s.lse_adjoint %%delta, %%lse_bar : !k3s.tile<Q>, !k3s.tile<Q>/k3s.lse_adjoint %%delta, %%lse_bar : !k3s.tile<Q>, !k3s.tile<>/' | not k3c opt - 2>&1 | filecheck %s --check-prefix=LSE
// RUN: k3c opt %s -p 'derive-block-attnres-backward{partials-backward=query-blocks}' | sed 's/k3s.add_source_cotangent %%x_bar_1/k3s.add_source_cotangent %%p/' | not k3c opt - 2>&1 | filecheck %s --check-prefix=ADD
// RUN: k3c opt %s -p 'derive-block-attnres-backward{partials-backward=query-blocks}' | sed 's/%%mix = k3s.load_row %%block_mix/%%mix = k3s.load_row %%block_lse/' | not k3c opt - 2>&1 | filecheck %s --check-prefix=PARTIALS
// RUN: k3c opt %s -p 'derive-block-attnres-backward{partials-backward=query-blocks}' | sed 's/%%dout_1, %%dblock_lse, %%dblock_mix/%%dout_1, %%dblock_mix, %%dblock_lse/' | not k3c opt - 2>&1 | filecheck %s --check-prefix=STORE
// The example spec (K3's width) shown.
// RUN: k3c ir %examples/attnres.toml -p 'derive-block-attnres,derive-block-attnres-backward{partials-backward=query-blocks}' | filecheck %s --check-prefix=K3

builtin.module {
  k3.attnres @ar <hidden_size = 96, num_blocks = 6, block_size = 4, eps = 0.0001, dtype = bfloat16>
  k3.attnres @wide <hidden_size = 9000, num_blocks = 2, block_size = 4, eps = 0.001, dtype = float32>
}

// CHECK:      builtin.module {
// CHECK:   k3.attnres @ar <hidden_size = 96, num_blocks = 6, block_size = 4, eps = 0.0001, dtype = bfloat16>
// CHECK-NEXT:   k3s.entry @ar_block_partials_backward <source = @ar, max_sources = 6> {
// CHECK-NEXT:     %representatives = k3s.tensor_arg @representatives <role = input> : !k3s.tensor<S x B x T x 96, float>
// CHECK-NEXT:     %queries = k3s.tensor_arg @queries <role = input> : !k3s.tensor<Q x 96, float>
// CHECK-NEXT:     %gains = k3s.tensor_arg @gains <role = input> : !k3s.tensor<Q x 96, float>
// CHECK-NEXT:     %block_lse = k3s.tensor_arg @block_lse <role = input> : !k3s.tensor<Q x B x T, float32>
// CHECK-NEXT:     %block_mix = k3s.tensor_arg @block_mix <role = input> : !k3s.tensor<Q x B x T x 96, float>
// CHECK-NEXT:     %dblock_lse = k3s.tensor_arg @dblock_lse <role = input> : !k3s.tensor<Q x B x T, float32>
// CHECK-NEXT:     %dblock_mix = k3s.tensor_arg @dblock_mix <role = input> : !k3s.tensor<Q x B x T x 96, float>
// CHECK-NEXT:     %drepresentatives = k3s.tensor_arg @drepresentatives <role = output, fill = 0> : !k3s.tensor<S x B x T x 96, float32>
// CHECK-NEXT:     %dqueries = k3s.tensor_arg @dqueries <role = output, fill = 0> : !k3s.tensor<Q x 96, float32>
// CHECK-NEXT:     %dgains = k3s.tensor_arg @dgains <role = output, fill = 0> : !k3s.tensor<Q x 96, float32>
// CHECK-NEXT:     k3s.kernel @ar_block_partials_backward <grid = [row_group_query_block], num_warps = 8, num_stages = 3> {
// CHECK-NEXT:       %q = k3s.fold_query %queries, %gains <hidden_size = 96, queries = 32> : !k3s.tile<Q x D>
// CHECK-NEXT:       %q_bar = k3s.zeros : !k3s.tile<Q x D>
// CHECK-NEXT:       %q_bar_1 = k3s.row_loop %q_bar <rows = 16> {
// CHECK-NEXT:       ^bb0(%q_bar_2: !k3s.tile<Q x D>):
// CHECK-NEXT:         %lse = k3s.load_query_rows %block_lse : !k3s.tile<Q>
// CHECK-NEXT:         %out = k3s.load_query_rows %block_mix : !k3s.tile<Q x D>
// CHECK-NEXT:         %dout = k3s.load_query_rows %dblock_mix : !k3s.tile<Q x D>
// CHECK-NEXT:         %delta = k3s.softmax_delta %dout, %out : !k3s.tile<Q>
// CHECK-NEXT:         %lse_bar = k3s.load_query_rows %dblock_lse : !k3s.tile<Q>
// CHECK-NEXT:         %delta_1, %score_bar_sum = k3s.lse_adjoint %delta, %lse_bar : !k3s.tile<Q>, !k3s.tile<Q>
// CHECK-NEXT:         %k_mean = k3s.zeros : !k3s.tile<Q x D>
// CHECK-NEXT:         %q_bar_3, %k_mean_1, %score_bar_sum_1 = k3s.source_loop %q_bar_2, %k_mean, %score_bar_sum {
// CHECK-NEXT:         ^bb0(%q_bar_4: !k3s.tile<Q x D>, %k_mean_2: !k3s.tile<Q x D>, %score_bar_sum_2: !k3s.tile<Q>):
// CHECK-NEXT:           %x = k3s.load_source %representatives : !k3s.tile<D>
// CHECK-NEXT:           %score = k3s.rms_score %x, %q <eps = 0.0001> : !k3s.tile<Q>
// CHECK-NEXT:           %p = k3s.softmax_weight %score, %lse : !k3s.tile<Q>
// CHECK-NEXT:           %dp = k3s.weight_cotangent %x, %dout : !k3s.tile<Q>
// CHECK-NEXT:           %score_bar = k3s.softmax_adjoint %p, %dp, %delta_1 : !k3s.tile<Q>
// CHECK-NEXT:           %x_bar = k3s.rms_score_adjoint %x, %q, %score, %score_bar <eps = 0.0001> : !k3s.tile<D>
// CHECK-NEXT:           %x_bar_1 = k3s.mix_adjoint %x_bar, %p, %dout : !k3s.tile<D>
// CHECK-NEXT:           k3s.add_source_cotangent %x_bar_1, %drepresentatives
// CHECK-NEXT:           %q_bar_5, %k_mean_3, %score_bar_sum_3 = k3s.query_adjoint %x, %p, %score_bar, %q_bar_4, %k_mean_2, %score_bar_sum_2 <eps = 0.0001> : !k3s.tile<Q x D>, !k3s.tile<Q x D>, !k3s.tile<Q>
// CHECK-NEXT:           k3s.next_source %q_bar_5, %k_mean_3, %score_bar_sum_3
// CHECK-NEXT:         } : !k3s.tile<Q x D>, !k3s.tile<Q x D>, !k3s.tile<Q>
// CHECK-NEXT:         %q_bar_6 = k3s.recentre_query_adjoint %q_bar_3, %k_mean_1, %score_bar_sum_1 : !k3s.tile<Q x D>
// CHECK-NEXT:         k3s.next_row %q_bar_6
// CHECK-NEXT:       } : !k3s.tile<Q x D>
// CHECK-NEXT:       k3s.store_query_cotangent %q_bar_1, %queries, %gains, %dqueries, %dgains
// CHECK-NEXT:     }
// CHECK-NEXT:   }
// CHECK-NEXT:   k3s.entry @ar_block_merge_backward <source = @ar, max_sources = 1> {
// CHECK-NEXT:     %partial_sum = k3s.tensor_arg @partial_sum <role = input> : !k3s.tensor<S x B x T x 96, float>
// CHECK-NEXT:     %query = k3s.tensor_arg @query <role = input> : !k3s.tensor<96, float>
// CHECK-NEXT:     %gain = k3s.tensor_arg @gain <role = input> : !k3s.tensor<96, float>
// CHECK-NEXT:     %block_lse = k3s.tensor_arg @block_lse <role = input> : !k3s.tensor<B x T, float32>
// CHECK-NEXT:     %block_mix = k3s.tensor_arg @block_mix <role = input> : !k3s.tensor<B x T x 96, float>
// CHECK-NEXT:     %out = k3s.tensor_arg @out <role = input> : !k3s.tensor<B x T x 96, float>
// CHECK-NEXT:     %lse = k3s.tensor_arg @lse <role = input> : !k3s.tensor<B x T, float32>
// CHECK-NEXT:     %dout = k3s.tensor_arg @dout <role = input> : !k3s.tensor<B x T x 96, float>
// CHECK-NEXT:     %dpartial_sum = k3s.tensor_arg @dpartial_sum <role = output> : !k3s.tensor<S x B x T x 96, float>
// CHECK-NEXT:     %dquery = k3s.tensor_arg @dquery <role = output, fill = 0> : !k3s.tensor<96, float32>
// CHECK-NEXT:     %dgain = k3s.tensor_arg @dgain <role = output, fill = 0> : !k3s.tensor<96, float32>
// CHECK-NEXT:     %dblock_lse = k3s.tensor_arg @dblock_lse <role = output> : !k3s.tensor<B x T, float32>
// CHECK-NEXT:     %dblock_mix = k3s.tensor_arg @dblock_mix <role = output> : !k3s.tensor<B x T x 96, float>
// CHECK-NEXT:     k3s.kernel @ar_block_merge_backward <grid = [row_group], num_warps = 16> {
// CHECK-NEXT:       %q = k3s.fold_query %query, %gain <hidden_size = 96> : !k3s.tile<D>
// CHECK-NEXT:       %q_bar = k3s.zeros : !k3s.tile<D>
// CHECK-NEXT:       %q_bar_1 = k3s.row_loop %q_bar <rows = 16> {
// CHECK-NEXT:       ^bb0(%q_bar_2: !k3s.tile<D>):
// CHECK-NEXT:         %lse_1 = k3s.load_row %lse : !k3s.tile<>
// CHECK-NEXT:         %out_1 = k3s.load_row %out : !k3s.tile<D>
// CHECK-NEXT:         %dout_1 = k3s.load_row %dout : !k3s.tile<D>
// CHECK-NEXT:         %delta = k3s.softmax_delta %dout_1, %out_1 : !k3s.tile<>
// CHECK-NEXT:         %partials_lse = k3s.load_row %block_lse : !k3s.tile<>
// CHECK-NEXT:         %mix = k3s.load_row %block_mix : !k3s.tile<D>
// CHECK-NEXT:         %alpha, %lse_bar = k3s.partials_adjoint %partials_lse, %lse_1, %mix, %dout_1, %delta : !k3s.tile<>, !k3s.tile<>
// CHECK-NEXT:         %k_mean = k3s.zeros : !k3s.tile<D>
// CHECK-NEXT:         %q_bar_3, %k_mean_1, %score_bar_sum = k3s.source_loop %q_bar_2, %k_mean, %lse_bar {
// CHECK-NEXT:         ^bb0(%q_bar_4: !k3s.tile<D>, %k_mean_2: !k3s.tile<D>, %score_bar_sum_1: !k3s.tile<>):
// CHECK-NEXT:           %x = k3s.load_source %partial_sum : !k3s.tile<D>
// CHECK-NEXT:           %score = k3s.rms_score %x, %q <eps = 0.0001> : !k3s.tile<>
// CHECK-NEXT:           %p = k3s.softmax_weight %score, %lse_1 : !k3s.tile<>
// CHECK-NEXT:           %dp = k3s.weight_cotangent %x, %dout_1 : !k3s.tile<>
// CHECK-NEXT:           %score_bar = k3s.softmax_adjoint %p, %dp, %delta : !k3s.tile<>
// CHECK-NEXT:           %x_bar = k3s.rms_score_adjoint %x, %q, %score, %score_bar <eps = 0.0001> : !k3s.tile<D>
// CHECK-NEXT:           %x_bar_1 = k3s.mix_adjoint %x_bar, %p, %dout_1 : !k3s.tile<D>
// CHECK-NEXT:           k3s.store_source_cotangent %x_bar_1, %dpartial_sum
// CHECK-NEXT:           %q_bar_5, %k_mean_3, %score_bar_sum_2 = k3s.query_adjoint %x, %p, %score_bar, %q_bar_4, %k_mean_2, %score_bar_sum_1 <eps = 0.0001> : !k3s.tile<D>, !k3s.tile<D>, !k3s.tile<>
// CHECK-NEXT:           k3s.next_source %q_bar_5, %k_mean_3, %score_bar_sum_2
// CHECK-NEXT:         } : !k3s.tile<D>, !k3s.tile<D>, !k3s.tile<>
// CHECK-NEXT:         %q_bar_6 = k3s.recentre_query_adjoint %q_bar_3, %k_mean_1, %score_bar_sum : !k3s.tile<D>
// CHECK-NEXT:         k3s.store_partials_cotangent %alpha, %lse_bar, %score_bar_sum, %dout_1, %dblock_lse, %dblock_mix
// CHECK-NEXT:         k3s.next_row %q_bar_6
// CHECK-NEXT:       } : !k3s.tile<D>
// CHECK-NEXT:       k3s.store_query_cotangent %q_bar_1, %query, %gain, %dquery, %dgain
// CHECK-NEXT:     }
// CHECK-NEXT:   }
// CHECK-NEXT:   k3.attnres @wide <hidden_size = 9000, num_blocks = 2, block_size = 4, eps = 0.001, dtype = float32>

// ORDER:      k3.attnres @ar
// ORDER-NEXT: k3s.entry @ar_aggregate <source = @ar, max_sources = 7> {
// ORDER:      k3s.entry @ar_aggregate_backward <source = @ar, max_sources = 7> {
// ORDER:      k3s.entry @ar_block_partials <source = @ar, max_sources = 6> {
// ORDER:      k3s.entry @ar_block_merge <source = @ar, max_sources = 1> {
// ORDER:      k3s.entry @ar_block_partials_backward <source = @ar, max_sources = 6> {
// ORDER:      k3s.entry @ar_block_merge_backward <source = @ar, max_sources = 1> {
// ORDER-NOT:  k3s.entry @ar_
// ORDER:      k3.attnres @wide

// OPTS:       k3s.kernel @ar_block_partials_backward <grid = [row_group_query_block], num_warps = 8, num_stages = 3> {
// OPTS-NEXT:    %q = k3s.fold_query %queries, %gains <hidden_size = 96, queries = 2> : !k3s.tile<Q x D>
// OPTS:         k3s.row_loop %q_bar <rows = 4> {
// OPTS:       k3s.kernel @ar_block_merge_backward <grid = [row_group], num_warps = 8> {
// OPTS:         k3s.row_loop %q_bar <rows = 4> {

// WIDE:       k3s.kernel @wide_block_partials_backward <grid = [row_group_query_block], num_warps = 32, num_stages = 3> {
// WIDE-NEXT:    %q = k3s.fold_query %queries, %gains <hidden_size = 9000, queries = 1> : !k3s.tile<Q x D>
// WIDE:       k3s.kernel @wide_block_merge_backward <grid = [row_group], num_warps = 32> {

// POW2: {{^}}k3c opt: error: pipeline 'derive-block-attnres-backward{queries-per-program=3}': derive-block-attnres-backward: queries-per-program must be a power of two, got 3{{$}}
// ROWS0: {{^}}k3c opt: error: pipeline 'derive-block-attnres-backward{rows-per-program=0}': derive-block-attnres-backward: rows-per-program must be >= 1, got 0{{$}}
// STAGES: {{^}}k3c opt: error: pipeline 'derive-block-attnres-backward{num-stages=0}': derive-block-attnres-backward: num-stages must be >= 1, got 0{{$}}
// NUMERATOR: {{^}}k3c opt: error: {{.*}}derive-block-attnres-backward: the backward takes derive-block-attnres's normalised partials (partials=normalised), got ar_block_merge with the numerator form{{$}}

// ROWS: k3s.load_query_rows: the rows must be <Q x D>, got <Q>
// LSE: k3s.lse_adjoint: the score cotangents' sum must be <Q>, got <>
// ADD: k3s.add_source_cotangent: the row's cotangent must be <D>, got <Q>
// PARTIALS: k3s.load_row: the row must be <>, got <D>
// STORE: k3s.store_partials_cotangent: dblock_lse must have 2 dimensions, got 3 (B,T,96)

// K3:      k3s.entry @block_partials_backward <source = @attnres, max_sources = 8> {
// K3:        k3s.kernel @attnres_block_partials_backward <grid = [row_group_query_block], num_warps = 16, num_stages = 3> {
// K3-NEXT:     %q = k3s.fold_query %queries, %gains <hidden_size = 7168, queries = 1> : !k3s.tile<Q x D>
// K3:      k3s.entry @block_merge_backward <source = @attnres, max_sources = 1> {
// K3:        k3s.kernel @attnres_block_merge_backward <grid = [row_group], num_warps = 16> {
