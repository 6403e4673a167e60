// k3.attnres (Block AttnRes); float_exponent.mlir covers eps in exponent form (1e-06).
// RUN: k3c opt %s | filecheck %s --match-full-lines
// RUN: k3c opt %s --generic | k3c opt - | filecheck %s --match-full-lines
// RUN: k3c opt %s --generic | filecheck %s --check-prefix=GENERIC
// RUN: k3c opt %s > %t.once && k3c opt %t.once > %t.twice && diff %t.once %t.twice

builtin.module {
  k3.attnres @attnres <hidden_size = 7168, num_blocks = 8, block_size = 12, eps = 0.0001, dtype = bfloat16>
}

// CHECK:      builtin.module {
// CHECK-NEXT:   k3.attnres @attnres <hidden_size = 7168, num_blocks = 8, block_size = 12, eps = 0.0001, dtype = bfloat16>
// CHECK-NEXT: }

// GENERIC:      "builtin.module"() ({
// GENERIC-NEXT:   "k3.attnres"() <{sym_name = "attnres", hidden_size = 7168 : i64, num_blocks = 8 : i64, block_size = 12 : i64, eps = 1.000000e-04 : f64, dtype = #k3<dtype bfloat16>}> : () -> ()
// GENERIC-NEXT: }) : () -> ()
