// The k3s schedule dialect: a fused AttnRes entry (optional max_sources present) next to an
// entry without it and with an empty body (printed, as xDSL does, as one
// empty block `^bb0:`; a bare `{}` would be a region with no block), and the source_loop region
// in value form: three carried values as block arguments, results and the closing next_source.
// The stages that read or write memory take the entry's tensor arguments as operands.
// RUN: k3c opt %s | filecheck %s --match-full-lines
// RUN: k3c opt %s --generic | k3c opt - | filecheck %s --match-full-lines
// RUN: k3c opt %s --generic | filecheck %s --check-prefix=GENERIC
// RUN: k3c opt %s > %t.once && k3c opt %t.once > %t.twice && diff %t.once %t.twice

builtin.module {
  k3s.entry @aggregate <source = ar, max_sources = 5> {
    %sources = k3s.tensor_arg @sources <role = input> : !k3s.tensor<S x B x T x 32, float>
    %query = k3s.tensor_arg @query <role = input> : !k3s.tensor<32, float>
    %gain = k3s.tensor_arg @gain <role = input> : !k3s.tensor<32, float>
    %out = k3s.tensor_arg @out <role = output> : !k3s.tensor<B x T x 32, float>
    k3s.kernel @ar_aggregate <grid = row, num_warps = 8> {
      %q = k3s.fold_query %query, %gain <hidden_size = 32> : !k3s.tile<D>
      %max, %sum, %acc = k3s.source_loop {
      ^bb0(%max_1: !k3s.tile<>, %sum_1: !k3s.tile<>, %acc_1: !k3s.tile<D>):
        %x = k3s.load_source %sources : !k3s.tile<D>
        %score = k3s.rms_score %x, %q <eps = 0.001> : !k3s.tile<>
        %max_2, %sum_2, %p, %rescale = k3s.online_softmax %max_1, %sum_1, %score : !k3s.tile<>, !k3s.tile<>, !k3s.tile<>, !k3s.tile<>
        %acc_2 = k3s.mix_accumulate %acc_1, %rescale, %p, %x : !k3s.tile<D>
        k3s.next_source %max_2, %sum_2, %acc_2
      } : !k3s.tile<>, !k3s.tile<>, !k3s.tile<D>
      k3s.normalize_store %acc, %sum, %out
    }
  }
  k3s.entry @empty <source = other> {
  ^bb0:
  }
}

// CHECK:      builtin.module {
// CHECK-NEXT:   k3s.entry @aggregate <source = ar, max_sources = 5> {
// CHECK-NEXT:     %sources = k3s.tensor_arg @sources <role = input> : !k3s.tensor<S x B x T x 32, float>
// CHECK-NEXT:     %query = k3s.tensor_arg @query <role = input> : !k3s.tensor<32, float>
// CHECK-NEXT:     %gain = k3s.tensor_arg @gain <role = input> : !k3s.tensor<32, float>
// CHECK-NEXT:     %out = k3s.tensor_arg @out <role = output> : !k3s.tensor<B x T x 32, float>
// CHECK-NEXT:     k3s.kernel @ar_aggregate <grid = row, num_warps = 8> {
// CHECK-NEXT:       %q = k3s.fold_query %query, %gain <hidden_size = 32> : !k3s.tile<D>
// CHECK-NEXT:       %max, %sum, %acc = k3s.source_loop {
// CHECK-NEXT:       ^bb0(%max_1: !k3s.tile<>, %sum_1: !k3s.tile<>, %acc_1: !k3s.tile<D>):
// CHECK-NEXT:         %x = k3s.load_source %sources : !k3s.tile<D>
// CHECK-NEXT:         %score = k3s.rms_score %x, %q <eps = 0.001> : !k3s.tile<>
// CHECK-NEXT:         %max_2, %sum_2, %p, %rescale = k3s.online_softmax %max_1, %sum_1, %score : !k3s.tile<>, !k3s.tile<>, !k3s.tile<>, !k3s.tile<>
// CHECK-NEXT:         %acc_2 = k3s.mix_accumulate %acc_1, %rescale, %p, %x : !k3s.tile<D>
// CHECK-NEXT:         k3s.next_source %max_2, %sum_2, %acc_2
// CHECK-NEXT:       } : !k3s.tile<>, !k3s.tile<>, !k3s.tile<D>
// CHECK-NEXT:       k3s.normalize_store %acc, %sum, %out
// CHECK-NEXT:     }
// CHECK-NEXT:   }
// CHECK-NEXT:   k3s.entry @empty <source = other> {
// CHECK-NEXT:   ^bb0:
// CHECK-NEXT:   }
// CHECK-NEXT: }

// GENERIC:      "builtin.module"() ({
// GENERIC-NEXT:   "k3s.entry"() <{sym_name = "aggregate", source = "ar", max_sources = 5 : i64}> ({
// GENERIC-NEXT:     %sources = "k3s.tensor_arg"() <{sym_name = "sources", role = #k3s<arg_role input>}> : () -> !k3s.tensor<S x B x T x 32, float>
// GENERIC-NEXT:     %query = "k3s.tensor_arg"() <{sym_name = "query", role = #k3s<arg_role input>}> : () -> !k3s.tensor<32, float>
// GENERIC-NEXT:     %gain = "k3s.tensor_arg"() <{sym_name = "gain", role = #k3s<arg_role input>}> : () -> !k3s.tensor<32, float>
// GENERIC-NEXT:     %out = "k3s.tensor_arg"() <{sym_name = "out", role = #k3s<arg_role output>}> : () -> !k3s.tensor<B x T x 32, float>
// GENERIC-NEXT:     "k3s.kernel"() <{sym_name = "ar_aggregate", grid = "row", num_warps = 8 : i64}> ({
// GENERIC-NEXT:       %q = "k3s.fold_query"(%query, %gain) <{hidden_size = 32 : i64}> : (!k3s.tensor<32, float>, !k3s.tensor<32, float>) -> !k3s.tile<D>
// GENERIC-NEXT:       %max, %sum, %acc = "k3s.source_loop"() ({
// GENERIC-NEXT:       ^bb0(%max_1: !k3s.tile<>, %sum_1: !k3s.tile<>, %acc_1: !k3s.tile<D>):
// GENERIC-NEXT:         %x = "k3s.load_source"(%sources) : (!k3s.tensor<S x B x T x 32, float>) -> !k3s.tile<D>
// GENERIC-NEXT:         %score = "k3s.rms_score"(%x, %q) <{eps = 1.000000e-03 : f64}> : (!k3s.tile<D>, !k3s.tile<D>) -> !k3s.tile<>
// GENERIC-NEXT:         %max_2, %sum_2, %p, %rescale = "k3s.online_softmax"(%max_1, %sum_1, %score) : (!k3s.tile<>, !k3s.tile<>, !k3s.tile<>) -> (!k3s.tile<>, !k3s.tile<>, !k3s.tile<>, !k3s.tile<>)
// GENERIC-NEXT:         %acc_2 = "k3s.mix_accumulate"(%acc_1, %rescale, %p, %x) : (!k3s.tile<D>, !k3s.tile<>, !k3s.tile<>, !k3s.tile<D>) -> !k3s.tile<D>
// GENERIC-NEXT:         "k3s.next_source"(%max_2, %sum_2, %acc_2) : (!k3s.tile<>, !k3s.tile<>, !k3s.tile<D>) -> ()
// GENERIC-NEXT:       }) : () -> (!k3s.tile<>, !k3s.tile<>, !k3s.tile<D>)
// GENERIC-NEXT:       "k3s.normalize_store"(%acc, %sum, %out) : (!k3s.tile<D>, !k3s.tile<>, !k3s.tensor<B x T x 32, float>) -> ()
// GENERIC-NEXT:     }) : () -> ()
// GENERIC-NEXT:   }) : () -> ()
// GENERIC-NEXT:   "k3s.entry"() <{sym_name = "empty", source = "other"}> ({
// GENERIC-NEXT:   ^bb0:
// GENERIC-NEXT:   }) : () -> ()
// GENERIC-NEXT: }) : () -> ()
