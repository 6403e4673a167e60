// The k3s schedule dialect: a fused AttnRes entry (optional max_sources present) next to an
// entry without it and with an empty body (printed, as xDSL does, as one
// empty block `^bb0:`; a bare `{}` would be a region with no block), and the source_loop region.
// RUN: k3c opt %s | filecheck %s --match-full-lines
// RUN: k3c opt %s --generic | k3c opt - | filecheck %s --match-full-lines
// RUN: k3c opt %s --generic | filecheck %s --check-prefix=GENERIC
// RUN: k3c opt %s > %t.once && k3c opt %t.once > %t.twice && diff %t.once %t.twice

builtin.module {
  k3s.entry @aggregate <source = ar, max_sources = 5> {
    k3s.tensor_arg @sources <shape = "S,B,T,32", dtype = float, role = input>
    k3s.tensor_arg @out <shape = "B,T,32", dtype = float, role = output>
    k3s.kernel @ar_aggregate <grid = row, num_warps = 8> {
      k3s.fold_query <hidden_size = 32>
      k3s.source_loop {
        k3s.rms_score <eps = 0.001>
        k3s.online_softmax
        k3s.mix_accumulate
      }
      k3s.normalize_store
    }
  }
  k3s.entry @empty <source = other> {
  ^bb0:
  }
}

// CHECK:      builtin.module {
// CHECK-NEXT:   k3s.entry @aggregate <source = ar, max_sources = 5> {
// CHECK-NEXT:     k3s.tensor_arg @sources <shape = "S,B,T,32", dtype = float, role = input>
// CHECK-NEXT:     k3s.tensor_arg @out <shape = "B,T,32", dtype = float, role = output>
// CHECK-NEXT:     k3s.kernel @ar_aggregate <grid = row, num_warps = 8> {
// CHECK-NEXT:       k3s.fold_query <hidden_size = 32>
// CHECK-NEXT:       k3s.source_loop {
// CHECK-NEXT:         k3s.rms_score <eps = 0.001>
// CHECK-NEXT:         k3s.online_softmax
// CHECK-NEXT:         k3s.mix_accumulate
// CHECK-NEXT:       }
// CHECK-NEXT:       k3s.normalize_store
// CHECK-NEXT:     }
// CHECK-NEXT:   }
// CHECK-NEXT:   k3s.entry @empty <source = other> {
// CHECK-NEXT:   ^bb0:
// CHECK-NEXT:   }
// CHECK-NEXT: }

// GENERIC:      "builtin.module"() ({
// GENERIC-NEXT:   "k3s.entry"() <{sym_name = "aggregate", source = "ar", max_sources = 5 : i64}> ({
// GENERIC-NEXT:     "k3s.tensor_arg"() <{sym_name = "sources", shape = "S,B,T,32", dtype = "float", role = "input"}> : () -> ()
// GENERIC-NEXT:     "k3s.tensor_arg"() <{sym_name = "out", shape = "B,T,32", dtype = "float", role = "output"}> : () -> ()
// GENERIC-NEXT:     "k3s.kernel"() <{sym_name = "ar_aggregate", grid = "row", num_warps = 8 : i64}> ({
// GENERIC-NEXT:       "k3s.fold_query"() <{hidden_size = 32 : i64}> : () -> ()
// GENERIC-NEXT:       "k3s.source_loop"() ({
// GENERIC-NEXT:         "k3s.rms_score"() <{eps = 1.000000e-03 : f64}> : () -> ()
// GENERIC-NEXT:         "k3s.online_softmax"() : () -> ()
// GENERIC-NEXT:         "k3s.mix_accumulate"() : () -> ()
// GENERIC-NEXT:       }) : () -> ()
// GENERIC-NEXT:       "k3s.normalize_store"() : () -> ()
// GENERIC-NEXT:     }) : () -> ()
// GENERIC-NEXT:   }) : () -> ()
// GENERIC-NEXT:   "k3s.entry"() <{sym_name = "empty", source = "other"}> ({
// GENERIC-NEXT:   ^bb0:
// GENERIC-NEXT:   }) : () -> ()
// GENERIC-NEXT: }) : () -> ()
