// The k3s schedule dialect: a fused AttnRes entry (optional max_sources present) next to an
// entry without it and with an empty body (printed, as xDSL does, as one
// empty block `^bb0:`; a bare `{}` would be a region with no block), and the source_loop region
// in value form: three carried values as operands (the online softmax's start), block
// arguments, results and the closing next_source. The stages that read or write memory take the
// entry's tensor arguments as operands. The backward's kernel nests a source loop carrying one
// value in a row loop (its group of rows, a property).
// RUN: k3c opt %s | filecheck %s --match-full-lines
// RUN: k3c opt %s --generic | k3c opt - | filecheck %s --match-full-lines
// RUN: k3c opt %s --generic | filecheck %s --check-prefix=GENERIC
// RUN: k3c opt %s > %t.once && k3c opt %t.once > %t.twice && diff %t.once %t.twice

builtin.module {
  k3.attnres @ar <hidden_size = 32, num_blocks = 4, block_size = 2, eps = 1.0e-06, dtype = float32>
  k3.attnres @other <hidden_size = 32, num_blocks = 4, block_size = 2, eps = 1.0e-06, dtype = float32>
  k3s.entry @aggregate <source = @ar, max_sources = 5> {
    %sources = k3s.tensor_arg @sources <role = input> : !k3s.tensor<S x B x T x 32, float>
    %query = k3s.tensor_arg @query <role = input> : !k3s.tensor<32, float>
    %gain = k3s.tensor_arg @gain <role = input> : !k3s.tensor<32, float>
    %out = k3s.tensor_arg @out <role = output> : !k3s.tensor<B x T x 32, float>
    %lse = k3s.tensor_arg @lse <role = optional_output> : !k3s.tensor<B x T, float32>
    k3s.kernel @ar_aggregate <grid = [row], num_warps = 8> {
      %q = k3s.fold_query %query, %gain <hidden_size = 32> : !k3s.tile<D>
      %max, %sum, %acc = k3s.softmax_start : !k3s.tile<>, !k3s.tile<>, !k3s.tile<D>
      %max_1, %sum_1, %acc_1 = k3s.source_loop %max, %sum, %acc {
      ^bb0(%max_2: !k3s.tile<>, %sum_2: !k3s.tile<>, %acc_2: !k3s.tile<D>):
        %x = k3s.load_source %sources : !k3s.tile<D>
        %score = k3s.rms_score %x, %q <eps = 0.001> : !k3s.tile<>
        %max_3, %sum_3, %p, %rescale = k3s.online_softmax %max_2, %sum_2, %score : !k3s.tile<>, !k3s.tile<>, !k3s.tile<>, !k3s.tile<>
        %acc_3 = k3s.mix_accumulate %acc_2, %rescale, %p, %x : !k3s.tile<D>
        k3s.next_source %max_3, %sum_3, %acc_3
      } : !k3s.tile<>, !k3s.tile<>, !k3s.tile<D>
      k3s.normalize_store %acc_1, %sum_1, %out
      k3s.store_lse %max_1, %sum_1, %lse
    }
  }
  k3s.entry @aggregate_backward <source = @ar, max_sources = 5> {
    %sources = k3s.tensor_arg @sources <role = input> : !k3s.tensor<S x B x T x 32, float>
    %query = k3s.tensor_arg @query <role = input> : !k3s.tensor<32, float>
    %gain = k3s.tensor_arg @gain <role = input> : !k3s.tensor<32, float>
    %out = k3s.tensor_arg @out <role = input> : !k3s.tensor<B x T x 32, float>
    %lse = k3s.tensor_arg @lse <role = input> : !k3s.tensor<B x T, float32>
    %dout = k3s.tensor_arg @dout <role = input> : !k3s.tensor<B x T x 32, float>
    %dsources = k3s.tensor_arg @dsources <role = output> : !k3s.tensor<S x B x T x 32, float>
    %dquery = k3s.tensor_arg @dquery <role = output, fill = 0> : !k3s.tensor<32, float32>
    %dgain = k3s.tensor_arg @dgain <role = output, fill = 0> : !k3s.tensor<32, float32>
    k3s.kernel @ar_aggregate_backward <grid = [row_group], num_warps = 16, num_stages = 3> {
      %q = k3s.fold_query %query, %gain <hidden_size = 32> : !k3s.tile<D>
      %q_bar = k3s.zeros : !k3s.tile<D>
      %q_bar_1 = k3s.row_loop %q_bar <rows = 16> {
      ^bb0(%q_bar_2: !k3s.tile<D>):
        %lse_1 = k3s.load_row %lse : !k3s.tile<>
        %out_1 = k3s.load_row %out : !k3s.tile<D>
        %dout_1 = k3s.load_row %dout : !k3s.tile<D>
        %delta = k3s.softmax_delta %dout_1, %out_1 : !k3s.tile<>
        %k_mean = k3s.zeros : !k3s.tile<D>
        %score_bar_sum = k3s.zeros : !k3s.tile<>
        %q_bar_3, %k_mean_1, %score_bar_sum_1 = k3s.source_loop %q_bar_2, %k_mean, %score_bar_sum {
        ^bb0(%q_bar_4: !k3s.tile<D>, %k_mean_2: !k3s.tile<D>, %score_bar_sum_2: !k3s.tile<>):
          %x = k3s.load_source %sources : !k3s.tile<D>
          %score = k3s.rms_score %x, %q <eps = 0.001> : !k3s.tile<>
          %p = k3s.softmax_weight %score, %lse_1 : !k3s.tile<>
          %dp = k3s.weight_cotangent %x, %dout_1 : !k3s.tile<>
          %score_bar = k3s.softmax_adjoint %p, %dp, %delta : !k3s.tile<>
          %x_bar = k3s.rms_score_adjoint %x, %q, %score, %score_bar <eps = 0.001> : !k3s.tile<D>
          %x_bar_1 = k3s.mix_adjoint %x_bar, %p, %dout_1 : !k3s.tile<D>
          k3s.store_source_cotangent %x_bar_1, %dsources
          %q_bar_5, %k_mean_3, %score_bar_sum_3 = k3s.query_adjoint %x, %p, %score_bar, %q_bar_4, %k_mean_2, %score_bar_sum_2 <eps = 0.001> : !k3s.tile<D>, !k3s.tile<D>, !k3s.tile<>
          k3s.next_source %q_bar_5, %k_mean_3, %score_bar_sum_3
        } : !k3s.tile<D>, !k3s.tile<D>, !k3s.tile<>
        %q_bar_6 = k3s.recentre_query_adjoint %q_bar_3, %k_mean_1, %score_bar_sum_1 : !k3s.tile<D>
        k3s.next_row %q_bar_6
      } : !k3s.tile<D>
      k3s.store_query_cotangent %q_bar_1, %query, %gain, %dquery, %dgain
    }
  }
  k3s.entry @empty <source = @other> {
  ^bb0:
  }
}

// CHECK:      builtin.module {
// CHECK-NEXT:   k3.attnres @ar <hidden_size = 32, num_blocks = 4, block_size = 2, eps = 1.0e-06, dtype = float32>
// CHECK-NEXT:   k3.attnres @other <hidden_size = 32, num_blocks = 4, block_size = 2, eps = 1.0e-06, dtype = float32>
// CHECK-NEXT:   k3s.entry @aggregate <source = @ar, max_sources = 5> {
// CHECK-NEXT:     %sources = k3s.tensor_arg @sources <role = input> : !k3s.tensor<S x B x T x 32, float>
// CHECK-NEXT:     %query = k3s.tensor_arg @query <role = input> : !k3s.tensor<32, float>
// CHECK-NEXT:     %gain = k3s.tensor_arg @gain <role = input> : !k3s.tensor<32, float>
// CHECK-NEXT:     %out = k3s.tensor_arg @out <role = output> : !k3s.tensor<B x T x 32, float>
// CHECK-NEXT:     %lse = k3s.tensor_arg @lse <role = optional_output> : !k3s.tensor<B x T, float32>
// CHECK-NEXT:     k3s.kernel @ar_aggregate <grid = [row], num_warps = 8> {
// CHECK-NEXT:       %q = k3s.fold_query %query, %gain <hidden_size = 32> : !k3s.tile<D>
// CHECK-NEXT:       %max, %sum, %acc = k3s.softmax_start : !k3s.tile<>, !k3s.tile<>, !k3s.tile<D>
// CHECK-NEXT:       %max_1, %sum_1, %acc_1 = k3s.source_loop %max, %sum, %acc {
// CHECK-NEXT:       ^bb0(%max_2: !k3s.tile<>, %sum_2: !k3s.tile<>, %acc_2: !k3s.tile<D>):
// CHECK-NEXT:         %x = k3s.load_source %sources : !k3s.tile<D>
// CHECK-NEXT:         %score = k3s.rms_score %x, %q <eps = 0.001> : !k3s.tile<>
// CHECK-NEXT:         %max_3, %sum_3, %p, %rescale = k3s.online_softmax %max_2, %sum_2, %score : !k3s.tile<>, !k3s.tile<>, !k3s.tile<>, !k3s.tile<>
// CHECK-NEXT:         %acc_3 = k3s.mix_accumulate %acc_2, %rescale, %p, %x : !k3s.tile<D>
// CHECK-NEXT:         k3s.next_source %max_3, %sum_3, %acc_3
// CHECK-NEXT:       } : !k3s.tile<>, !k3s.tile<>, !k3s.tile<D>
// CHECK-NEXT:       k3s.normalize_store %acc_1, %sum_1, %out
// CHECK-NEXT:       k3s.store_lse %max_1, %sum_1, %lse
// CHECK-NEXT:     }
// CHECK-NEXT:   }
// CHECK-NEXT:   k3s.entry @aggregate_backward <source = @ar, max_sources = 5> {
// CHECK-NEXT:     %sources = k3s.tensor_arg @sources <role = input> : !k3s.tensor<S x B x T x 32, float>
// CHECK-NEXT:     %query = k3s.tensor_arg @query <role = input> : !k3s.tensor<32, float>
// CHECK-NEXT:     %gain = k3s.tensor_arg @gain <role = input> : !k3s.tensor<32, float>
// CHECK-NEXT:     %out = k3s.tensor_arg @out <role = input> : !k3s.tensor<B x T x 32, float>
// CHECK-NEXT:     %lse = k3s.tensor_arg @lse <role = input> : !k3s.tensor<B x T, float32>
// CHECK-NEXT:     %dout = k3s.tensor_arg @dout <role = input> : !k3s.tensor<B x T x 32, float>
// CHECK-NEXT:     %dsources = k3s.tensor_arg @dsources <role = output> : !k3s.tensor<S x B x T x 32, float>
// CHECK-NEXT:     %dquery = k3s.tensor_arg @dquery <role = output, fill = 0> : !k3s.tensor<32, float32>
// CHECK-NEXT:     %dgain = k3s.tensor_arg @dgain <role = output, fill = 0> : !k3s.tensor<32, float32>
// CHECK-NEXT:     k3s.kernel @ar_aggregate_backward <grid = [row_group], num_warps = 16, num_stages = 3> {
// CHECK-NEXT:       %q = k3s.fold_query %query, %gain <hidden_size = 32> : !k3s.tile<D>
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
// CHECK-NEXT:           %score = k3s.rms_score %x, %q <eps = 0.001> : !k3s.tile<>
// CHECK-NEXT:           %p = k3s.softmax_weight %score, %lse_1 : !k3s.tile<>
// CHECK-NEXT:           %dp = k3s.weight_cotangent %x, %dout_1 : !k3s.tile<>
// CHECK-NEXT:           %score_bar = k3s.softmax_adjoint %p, %dp, %delta : !k3s.tile<>
// CHECK-NEXT:           %x_bar = k3s.rms_score_adjoint %x, %q, %score, %score_bar <eps = 0.001> : !k3s.tile<D>
// CHECK-NEXT:           %x_bar_1 = k3s.mix_adjoint %x_bar, %p, %dout_1 : !k3s.tile<D>
// CHECK-NEXT:           k3s.store_source_cotangent %x_bar_1, %dsources
// CHECK-NEXT:           %q_bar_5, %k_mean_3, %score_bar_sum_3 = k3s.query_adjoint %x, %p, %score_bar, %q_bar_4, %k_mean_2, %score_bar_sum_2 <eps = 0.001> : !k3s.tile<D>, !k3s.tile<D>, !k3s.tile<>
// CHECK-NEXT:           k3s.next_source %q_bar_5, %k_mean_3, %score_bar_sum_3
// CHECK-NEXT:         } : !k3s.tile<D>, !k3s.tile<D>, !k3s.tile<>
// CHECK-NEXT:         %q_bar_6 = k3s.recentre_query_adjoint %q_bar_3, %k_mean_1, %score_bar_sum_1 : !k3s.tile<D>
// CHECK-NEXT:         k3s.next_row %q_bar_6
// CHECK-NEXT:       } : !k3s.tile<D>
// CHECK-NEXT:       k3s.store_query_cotangent %q_bar_1, %query, %gain, %dquery, %dgain
// CHECK-NEXT:     }
// CHECK-NEXT:   }
// CHECK-NEXT:   k3s.entry @empty <source = @other> {
// CHECK-NEXT:   ^bb0:
// CHECK-NEXT:   }
// CHECK-NEXT: }

// GENERIC:      "builtin.module"() ({
// GENERIC-NEXT:   "k3.attnres"() <{sym_name = "ar", hidden_size = 32 : i64, num_blocks = 4 : i64, block_size = 2 : i64, eps = 1.000000e-06 : f64, dtype = #k3<dtype float32>}> : () -> ()
// GENERIC-NEXT:   "k3.attnres"() <{sym_name = "other", hidden_size = 32 : i64, num_blocks = 4 : i64, block_size = 2 : i64, eps = 1.000000e-06 : f64, dtype = #k3<dtype float32>}> : () -> ()
// GENERIC-NEXT:   "k3s.entry"() <{sym_name = "aggregate", source = @ar, max_sources = 5 : i64}> ({
// GENERIC-NEXT:     %sources = "k3s.tensor_arg"() <{sym_name = "sources", role = #k3s<arg_role input>}> : () -> !k3s.tensor<S x B x T x 32, float>
// GENERIC-NEXT:     %query = "k3s.tensor_arg"() <{sym_name = "query", role = #k3s<arg_role input>}> : () -> !k3s.tensor<32, float>
// GENERIC-NEXT:     %gain = "k3s.tensor_arg"() <{sym_name = "gain", role = #k3s<arg_role input>}> : () -> !k3s.tensor<32, float>
// GENERIC-NEXT:     %out = "k3s.tensor_arg"() <{sym_name = "out", role = #k3s<arg_role output>}> : () -> !k3s.tensor<B x T x 32, float>
// GENERIC-NEXT:     %lse = "k3s.tensor_arg"() <{sym_name = "lse", role = #k3s<arg_role optional_output>}> : () -> !k3s.tensor<B x T, float32>
// GENERIC-NEXT:     "k3s.kernel"() <{sym_name = "ar_aggregate", grid = [#k3s<grid_axis row>], num_warps = 8 : i64}> ({
// GENERIC-NEXT:       %q = "k3s.fold_query"(%query, %gain) <{hidden_size = 32 : i64}> : (!k3s.tensor<32, float>, !k3s.tensor<32, float>) -> !k3s.tile<D>
// GENERIC-NEXT:       %max, %sum, %acc = "k3s.softmax_start"() : () -> (!k3s.tile<>, !k3s.tile<>, !k3s.tile<D>)
// GENERIC-NEXT:       %max_1, %sum_1, %acc_1 = "k3s.source_loop"(%max, %sum, %acc) ({
// GENERIC-NEXT:       ^bb0(%max_2: !k3s.tile<>, %sum_2: !k3s.tile<>, %acc_2: !k3s.tile<D>):
// GENERIC-NEXT:         %x = "k3s.load_source"(%sources) : (!k3s.tensor<S x B x T x 32, float>) -> !k3s.tile<D>
// GENERIC-NEXT:         %score = "k3s.rms_score"(%x, %q) <{eps = 1.000000e-03 : f64}> : (!k3s.tile<D>, !k3s.tile<D>) -> !k3s.tile<>
// GENERIC-NEXT:         %max_3, %sum_3, %p, %rescale = "k3s.online_softmax"(%max_2, %sum_2, %score) : (!k3s.tile<>, !k3s.tile<>, !k3s.tile<>) -> (!k3s.tile<>, !k3s.tile<>, !k3s.tile<>, !k3s.tile<>)
// GENERIC-NEXT:         %acc_3 = "k3s.mix_accumulate"(%acc_2, %rescale, %p, %x) : (!k3s.tile<D>, !k3s.tile<>, !k3s.tile<>, !k3s.tile<D>) -> !k3s.tile<D>
// GENERIC-NEXT:         "k3s.next_source"(%max_3, %sum_3, %acc_3) : (!k3s.tile<>, !k3s.tile<>, !k3s.tile<D>) -> ()
// GENERIC-NEXT:       }) : (!k3s.tile<>, !k3s.tile<>, !k3s.tile<D>) -> (!k3s.tile<>, !k3s.tile<>, !k3s.tile<D>)
// GENERIC-NEXT:       "k3s.normalize_store"(%acc_1, %sum_1, %out) : (!k3s.tile<D>, !k3s.tile<>, !k3s.tensor<B x T x 32, float>) -> ()
// GENERIC-NEXT:       "k3s.store_lse"(%max_1, %sum_1, %lse) : (!k3s.tile<>, !k3s.tile<>, !k3s.tensor<B x T, float32>) -> ()
// GENERIC-NEXT:     }) : () -> ()
// GENERIC-NEXT:   }) : () -> ()
// GENERIC-NEXT:   "k3s.entry"() <{sym_name = "aggregate_backward", source = @ar, max_sources = 5 : i64}> ({
// GENERIC-NEXT:     %sources = "k3s.tensor_arg"() <{sym_name = "sources", role = #k3s<arg_role input>}> : () -> !k3s.tensor<S x B x T x 32, float>
// GENERIC-NEXT:     %query = "k3s.tensor_arg"() <{sym_name = "query", role = #k3s<arg_role input>}> : () -> !k3s.tensor<32, float>
// GENERIC-NEXT:     %gain = "k3s.tensor_arg"() <{sym_name = "gain", role = #k3s<arg_role input>}> : () -> !k3s.tensor<32, float>
// GENERIC-NEXT:     %out = "k3s.tensor_arg"() <{sym_name = "out", role = #k3s<arg_role input>}> : () -> !k3s.tensor<B x T x 32, float>
// GENERIC-NEXT:     %lse = "k3s.tensor_arg"() <{sym_name = "lse", role = #k3s<arg_role input>}> : () -> !k3s.tensor<B x T, float32>
// GENERIC-NEXT:     %dout = "k3s.tensor_arg"() <{sym_name = "dout", role = #k3s<arg_role input>}> : () -> !k3s.tensor<B x T x 32, float>
// GENERIC-NEXT:     %dsources = "k3s.tensor_arg"() <{sym_name = "dsources", role = #k3s<arg_role output>}> : () -> !k3s.tensor<S x B x T x 32, float>
// GENERIC-NEXT:     %dquery = "k3s.tensor_arg"() <{sym_name = "dquery", role = #k3s<arg_role output>, fill = 0 : i64}> : () -> !k3s.tensor<32, float32>
// GENERIC-NEXT:     %dgain = "k3s.tensor_arg"() <{sym_name = "dgain", role = #k3s<arg_role output>, fill = 0 : i64}> : () -> !k3s.tensor<32, float32>
// GENERIC-NEXT:     "k3s.kernel"() <{sym_name = "ar_aggregate_backward", grid = [#k3s<grid_axis row_group>], num_warps = 16 : i64, num_stages = 3 : i64}> ({
// GENERIC-NEXT:       %q = "k3s.fold_query"(%query, %gain) <{hidden_size = 32 : i64}> : (!k3s.tensor<32, float>, !k3s.tensor<32, float>) -> !k3s.tile<D>
// GENERIC-NEXT:       %q_bar = "k3s.zeros"() : () -> !k3s.tile<D>
// GENERIC-NEXT:       %q_bar_1 = "k3s.row_loop"(%q_bar) <{rows = 16 : i64}> ({
// GENERIC-NEXT:       ^bb0(%q_bar_2: !k3s.tile<D>):
// GENERIC-NEXT:         %lse_1 = "k3s.load_row"(%lse) : (!k3s.tensor<B x T, float32>) -> !k3s.tile<>
// GENERIC-NEXT:         %out_1 = "k3s.load_row"(%out) : (!k3s.tensor<B x T x 32, float>) -> !k3s.tile<D>
// GENERIC-NEXT:         %dout_1 = "k3s.load_row"(%dout) : (!k3s.tensor<B x T x 32, float>) -> !k3s.tile<D>
// GENERIC-NEXT:         %delta = "k3s.softmax_delta"(%dout_1, %out_1) : (!k3s.tile<D>, !k3s.tile<D>) -> !k3s.tile<>
// GENERIC-NEXT:         %k_mean = "k3s.zeros"() : () -> !k3s.tile<D>
// GENERIC-NEXT:         %score_bar_sum = "k3s.zeros"() : () -> !k3s.tile<>
// GENERIC-NEXT:         %q_bar_3, %k_mean_1, %score_bar_sum_1 = "k3s.source_loop"(%q_bar_2, %k_mean, %score_bar_sum) ({
// GENERIC-NEXT:         ^bb0(%q_bar_4: !k3s.tile<D>, %k_mean_2: !k3s.tile<D>, %score_bar_sum_2: !k3s.tile<>):
// GENERIC-NEXT:           %x = "k3s.load_source"(%sources) : (!k3s.tensor<S x B x T x 32, float>) -> !k3s.tile<D>
// GENERIC-NEXT:           %score = "k3s.rms_score"(%x, %q) <{eps = 1.000000e-03 : f64}> : (!k3s.tile<D>, !k3s.tile<D>) -> !k3s.tile<>
// GENERIC-NEXT:           %p = "k3s.softmax_weight"(%score, %lse_1) : (!k3s.tile<>, !k3s.tile<>) -> !k3s.tile<>
// GENERIC-NEXT:           %dp = "k3s.weight_cotangent"(%x, %dout_1) : (!k3s.tile<D>, !k3s.tile<D>) -> !k3s.tile<>
// GENERIC-NEXT:           %score_bar = "k3s.softmax_adjoint"(%p, %dp, %delta) : (!k3s.tile<>, !k3s.tile<>, !k3s.tile<>) -> !k3s.tile<>
// GENERIC-NEXT:           %x_bar = "k3s.rms_score_adjoint"(%x, %q, %score, %score_bar) <{eps = 1.000000e-03 : f64}> : (!k3s.tile<D>, !k3s.tile<D>, !k3s.tile<>, !k3s.tile<>) -> !k3s.tile<D>
// GENERIC-NEXT:           %x_bar_1 = "k3s.mix_adjoint"(%x_bar, %p, %dout_1) : (!k3s.tile<D>, !k3s.tile<>, !k3s.tile<D>) -> !k3s.tile<D>
// GENERIC-NEXT:           "k3s.store_source_cotangent"(%x_bar_1, %dsources) : (!k3s.tile<D>, !k3s.tensor<S x B x T x 32, float>) -> ()
// GENERIC-NEXT:           %q_bar_5, %k_mean_3, %score_bar_sum_3 = "k3s.query_adjoint"(%x, %p, %score_bar, %q_bar_4, %k_mean_2, %score_bar_sum_2) <{eps = 1.000000e-03 : f64}> : (!k3s.tile<D>, !k3s.tile<>, !k3s.tile<>, !k3s.tile<D>, !k3s.tile<D>, !k3s.tile<>) -> (!k3s.tile<D>, !k3s.tile<D>, !k3s.tile<>)
// GENERIC-NEXT:           "k3s.next_source"(%q_bar_5, %k_mean_3, %score_bar_sum_3) : (!k3s.tile<D>, !k3s.tile<D>, !k3s.tile<>) -> ()
// GENERIC-NEXT:         }) : (!k3s.tile<D>, !k3s.tile<D>, !k3s.tile<>) -> (!k3s.tile<D>, !k3s.tile<D>, !k3s.tile<>)
// GENERIC-NEXT:         %q_bar_6 = "k3s.recentre_query_adjoint"(%q_bar_3, %k_mean_1, %score_bar_sum_1) : (!k3s.tile<D>, !k3s.tile<D>, !k3s.tile<>) -> !k3s.tile<D>
// GENERIC-NEXT:         "k3s.next_row"(%q_bar_6) : (!k3s.tile<D>) -> ()
// GENERIC-NEXT:       }) : (!k3s.tile<D>) -> !k3s.tile<D>
// GENERIC-NEXT:       "k3s.store_query_cotangent"(%q_bar_1, %query, %gain, %dquery, %dgain) : (!k3s.tile<D>, !k3s.tensor<32, float>, !k3s.tensor<32, float>, !k3s.tensor<32, float32>, !k3s.tensor<32, float32>) -> ()
// GENERIC-NEXT:     }) : () -> ()
// GENERIC-NEXT:   }) : () -> ()
// GENERIC-NEXT:   "k3s.entry"() <{sym_name = "empty", source = @other}> ({
// GENERIC-NEXT:   ^bb0:
// GENERIC-NEXT:   }) : () -> ()
// GENERIC-NEXT: }) : () -> ()
