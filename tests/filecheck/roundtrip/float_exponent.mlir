// Floats whose shortest form has an exponent (1e-06, 1e+16) print with a '.' in the mantissa
// (1.0e-06): MLIR float literals need the dot, `1e-06` lexes as an integer and junk (so the
// input below must spell them with a dot as well). A regression
// test: they used to print as `1e-06`, so every example's eps broke re-parsing and `--generic`.
// RUN: k3c opt %s | filecheck %s --match-full-lines
// RUN: k3c opt %s | k3c opt - | filecheck %s --match-full-lines
// RUN: k3c opt %s --generic | k3c opt - | filecheck %s --match-full-lines
// RUN: k3c opt %s --generic | filecheck %s --check-prefix=GENERIC
// RUN: k3c opt %s > %t.once && k3c opt %t.once > %t.twice && diff %t.once %t.twice
// RUN: k3c opt %s -p fuse-attnres | k3c opt - | filecheck %s --check-prefix=FUSED

builtin.module {
  k3.attnres @attnres <hidden_size = 64, num_blocks = 2, block_size = 3, eps = 1.0e-06, dtype = float32>
  k3.latent_moe @moe <hidden_size = 64, latent_dim = 0, num_experts = 4, top_k = 2, expert_ffn_dim = 32, num_shared_experts = 0, shared_ffn_dim = 0, activation = swiglu, norm_topk_prob = true, routed_scaling_factor = 1.0e+16, eps = 2.5e-05, dtype = float32>
}

// CHECK:      builtin.module {
// CHECK-NEXT:   k3.attnres @attnres <hidden_size = 64, num_blocks = 2, block_size = 3, eps = 1.0e-06, dtype = float32>
// CHECK-NEXT:   k3.latent_moe @moe <hidden_size = 64, latent_dim = 0, num_experts = 4, top_k = 2, expert_ffn_dim = 32, num_shared_experts = 0, shared_ffn_dim = 0, activation = swiglu, norm_topk_prob = true, routed_scaling_factor = 1.0e+16, eps = 2.5e-05, dtype = float32>
// CHECK-NEXT: }

// GENERIC: "k3.attnres"() <{sym_name = "attnres", hidden_size = 64 : i64, num_blocks = 2 : i64, block_size = 3 : i64, eps = 1.000000e-06 : f64, dtype = #k3<dtype float32>}> : () -> ()
// GENERIC: routed_scaling_factor = 1.000000e+16 : f64, eps = 2.500000e-05 : f64

// FUSED: %score = k3s.rms_score %x, %q <eps = 1.0e-06> : !k3s.tile<>
