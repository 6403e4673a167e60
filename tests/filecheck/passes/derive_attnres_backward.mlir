// derive-attnres-backward: the attnres op stays and an `aggregate_backward` entry is added after
// it. Its arguments are the forward's inputs, what the forward saved (out, and lse: the rows'
// log-sum-exp, fp32, aggregate's optional output), the cotangent of out, and a gradient per
// input: dsources in the dtype of the sources (each element written once), dquery and dgain fp32
// and zero-filled (every program adds its share). One kernel over groups of rows: the folded
// query; per row (k3s.row_loop, carrying the query's cotangent from zero) the saved lse, out and
// dout and the softmax's correction dh . h; per source (k3s.source_loop, carrying the query's
// cotangent on and, from zero, what re-centres the row's share of it) the forward's score
// recomputed, the weight from the lse, the weight's and the score's cotangents, the adjoints of
// the score and of the mix, the source's store, the query's side of the score's adjoint; then the
// re-centring (the scores' cotangents made to sum to zero); after the rows, the fold's adjoint
// into dquery and dgain. The entry bounds the sources as aggregate does.
// RUN: k3c opt %s -p derive-attnres-backward | filecheck %s
// RUN: k3c opt %s -p derive-attnres-backward | k3c opt - | filecheck %s
// RUN: k3c opt %s -p derive-attnres-backward --generic | k3c opt - | filecheck %s
// After fuse-attnres (the default pipeline's order) the backward entry follows the aggregate.
// RUN: k3c opt %s -p fuse-attnres,derive-attnres-backward | filecheck %s --check-prefix=BOTH
// Its options: the rows a program takes, its warps (default: four times the forward's, 16 at
// least) and the source loop's pipelining.
// RUN: k3c opt %s -p 'derive-attnres-backward{rows-per-program=3 num-warps=4 num-stages=1}' | filecheck %s --check-prefix=OPTS
// RUN: k3c opt %s -p derive-attnres-backward | filecheck %s --check-prefix=WIDE
// RUN: not k3c opt %s -p 'derive-attnres-backward{rows-per-program=0}' 2>&1 | filecheck %s --check-prefix=ROWS
// RUN: not k3c opt %s -p 'derive-attnres-backward{num-stages=0}' 2>&1 | filecheck %s --check-prefix=STAGES
// RUN: not k3c opt %s -p 'derive-attnres-backward{num-warps=3}' 2>&1 | filecheck %s --check-prefix=WARPS
// The default pipeline of an attnres spec has it: its module gets aggregate and aggregate_backward.
// RUN: k3c passes | filecheck %s --check-prefix=PASSES

builtin.module {
  k3.attnres @ar <hidden_size = 96, num_blocks = 6, block_size = 4, eps = 0.0001, dtype = bfloat16>
  k3.attnres @wide <hidden_size = 9000, num_blocks = 2, block_size = 4, eps = 0.001, dtype = float32>
}

// CHECK:      builtin.module {
// CHECK-NEXT:   k3.attnres @ar <hidden_size = 96, num_blocks = 6, block_size = 4, eps = 0.0001, dtype = bfloat16>
// CHECK-NEXT:   k3s.entry @ar_aggregate_backward <source = @ar, max_sources = 7> {
// CHECK-NEXT:     %sources = k3s.tensor_arg @sources <role = input> : !k3s.tensor<S x B x T x 96, float>
// CHECK-NEXT:     %query = k3s.tensor_arg @query <role = input> : !k3s.tensor<96, float>
// CHECK-NEXT:     %gain = k3s.tensor_arg @gain <role = input> : !k3s.tensor<96, float>
// CHECK-NEXT:     %out = k3s.tensor_arg @out <role = input> : !k3s.tensor<B x T x 96, float>
// CHECK-NEXT:     %lse = k3s.tensor_arg @lse <role = input> : !k3s.tensor<B x T, float32>
// CHECK-NEXT:     %dout = k3s.tensor_arg @dout <role = input> : !k3s.tensor<B x T x 96, float>
// CHECK-NEXT:     %dsources = k3s.tensor_arg @dsources <role = output> : !k3s.tensor<S x B x T x 96, float>
// CHECK-NEXT:     %dquery = k3s.tensor_arg @dquery <role = output, fill = 0> : !k3s.tensor<96, float32>
// CHECK-NEXT:     %dgain = k3s.tensor_arg @dgain <role = output, fill = 0> : !k3s.tensor<96, float32>
// CHECK-NEXT:     k3s.kernel @ar_aggregate_backward <grid = [row_group], num_warps = 16, num_stages = 3> {
// CHECK-NEXT:       %q = k3s.fold_query %query, %gain <hidden_size = 96> : !k3s.tile<D>
// CHECK-NEXT:       %q_bar = k3s.zeros : !k3s.tile<D>
// CHECK-NEXT:       %q_bar_1 = k3s.row_loop %q_bar <rows = 16> {
// CHECK-NEXT:       ^bb0(%q_bar_2: !k3s.tile<D>):
// CHECK-NEXT:         %lse_1 = k3s.load_row %lse : !k3s.tile<>
// CHECK-NEXT:         %out_1 = k3s.load_row %out : !k3s.tile<D>
// CHECK-NEXT:         %dout_1 = k3s.load_row %dout : !k3s.tile<D>
// CHECK-NEXT:         %delta = k3s.softmax_delta %dout_1, %out_1 : !k3s.tile<>
// CHECK-NEXT:         %k_mean = k3s.zeros : !k3s.tile<D>
// CHECK-NEXT:         %score_bar_sum = k3s.zeros : !k3s.tile<>
// CHECK-NEXT:         %q_bar_3, %k_mean_1, %score_bar_sum_1 = k3s.source_loop %q_bar_2, %k_mean, %score_bar_sum {
// CHECK-NEXT:         ^bb0(%q_bar_4: !k3s.tile<D>, %k_mean_2: !k3s.tile<D>, %score_bar_sum_2: !k3s.tile<>):
// CHECK-NEXT:           %x = k3s.load_source %sources : !k3s.tile<D>
// CHECK-NEXT:           %score = k3s.rms_score %x, %q <eps = 0.0001> : !k3s.tile<>
// CHECK-NEXT:           %p = k3s.softmax_weight %score, %lse_1 : !k3s.tile<>
// CHECK-NEXT:           %dp = k3s.weight_cotangent %x, %dout_1 : !k3s.tile<>
// CHECK-NEXT:           %score_bar = k3s.softmax_adjoint %p, %dp, %delta : !k3s.tile<>
// CHECK-NEXT:           %x_bar = k3s.rms_score_adjoint %x, %q, %score, %score_bar <eps = 0.0001> : !k3s.tile<D>
// CHECK-NEXT:           %x_bar_1 = k3s.mix_adjoint %x_bar, %p, %dout_1 : !k3s.tile<D>
// CHECK-NEXT:           k3s.store_source_cotangent %x_bar_1, %dsources
// CHECK-NEXT:           %q_bar_5, %k_mean_3, %score_bar_sum_3 = k3s.query_adjoint %x, %p, %score_bar, %q_bar_4, %k_mean_2, %score_bar_sum_2 <eps = 0.0001> : !k3s.tile<D>, !k3s.tile<D>, !k3s.tile<>
// CHECK-NEXT:           k3s.next_source %q_bar_5, %k_mean_3, %score_bar_sum_3
// CHECK-NEXT:         } : !k3s.tile<D>, !k3s.tile<D>, !k3s.tile<>
// CHECK-NEXT:         %q_bar_6 = k3s.recentre_query_adjoint %q_bar_3, %k_mean_1, %score_bar_sum_1 : !k3s.tile<D>
// CHECK-NEXT:         k3s.next_row %q_bar_6
// CHECK-NEXT:       } : !k3s.tile<D>
// CHECK-NEXT:       k3s.store_query_cotangent %q_bar_1, %query, %gain, %dquery, %dgain
// CHECK-NEXT:     }
// CHECK-NEXT:   }
// CHECK-NEXT:   k3.attnres @wide

// BOTH:      k3.attnres @ar
// BOTH-NEXT: k3s.entry @ar_aggregate <source = @ar, max_sources = 7> {
// BOTH:      k3s.entry @ar_aggregate_backward <source = @ar, max_sources = 7> {
// BOTH:      k3.attnres @wide
// BOTH-NEXT: k3s.entry @wide_aggregate <source = @wide, max_sources = 3> {
// BOTH:      k3s.entry @wide_aggregate_backward <source = @wide, max_sources = 3> {

// OPTS:      k3s.kernel @ar_aggregate_backward <grid = [row_group], num_warps = 4, num_stages = 1> {
// OPTS:      k3s.row_loop %q_bar <rows = 3> {

// a row of 9000 columns needs 8 warps in the forward (2048 columns a warp): 32 here (the most)
// WIDE:      k3s.kernel @wide_aggregate_backward <grid = [row_group], num_warps = 32, num_stages = 3> {

// ROWS: {{^}}k3c opt: error: pipeline 'derive-attnres-backward{rows-per-program=0}': derive-attnres-backward: rows-per-program must be >= 1, got 0{{$}}
// STAGES: {{^}}k3c opt: error: pipeline 'derive-attnres-backward{num-stages=0}': derive-attnres-backward: num-stages must be >= 1, got 0{{$}}
// WARPS: {{^}}k3c opt: error: pipeline 'derive-attnres-backward{num-warps=3}': derive-attnres-backward: num-warps {{.*}}

// PASSES: derive-attnres-backward
// PASSES: attnres{{.*}}fuse-attnres,derive-attnres-backward,derive-block-attnres,derive-block-attnres-backward,outline-kernels
