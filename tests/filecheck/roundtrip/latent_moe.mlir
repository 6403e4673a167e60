// k3.latent_moe: a latent MoE (SiTU-GLU, shared experts, normalised top-k) and a full-width
// one (latent_dim = 0, SwiGLU, no shared experts) side by side.
// RUN: k3c opt %s | filecheck %s --match-full-lines
// RUN: k3c opt %s --generic | k3c opt - | filecheck %s --match-full-lines
// RUN: k3c opt %s --generic | filecheck %s --check-prefix=GENERIC
// RUN: k3c opt %s > %t.once && k3c opt %t.once > %t.twice && diff %t.once %t.twice

builtin.module {
  k3.latent_moe @latent <hidden_size = 7168, latent_dim = 3584, num_experts = 896, top_k = 16, expert_ffn_dim = 3072, num_shared_experts = 2, shared_ffn_dim = 3072, activation = situ_glu, norm_topk_prob = true, routed_scaling_factor = 2.5, eps = 0.0001, dtype = bfloat16>
  k3.latent_moe @full <hidden_size = 256, latent_dim = 0, num_experts = 8, top_k = 2, expert_ffn_dim = 128, num_shared_experts = 0, shared_ffn_dim = 0, activation = swiglu, norm_topk_prob = false, routed_scaling_factor = 1.0, eps = 0.001, dtype = float32>
}

// CHECK:      builtin.module {
// CHECK-NEXT:   k3.latent_moe @latent <hidden_size = 7168, latent_dim = 3584, num_experts = 896, top_k = 16, expert_ffn_dim = 3072, num_shared_experts = 2, shared_ffn_dim = 3072, activation = situ_glu, norm_topk_prob = true, routed_scaling_factor = 2.5, eps = 0.0001, dtype = bfloat16>
// CHECK-NEXT:   k3.latent_moe @full <hidden_size = 256, latent_dim = 0, num_experts = 8, top_k = 2, expert_ffn_dim = 128, num_shared_experts = 0, shared_ffn_dim = 0, activation = swiglu, norm_topk_prob = false, routed_scaling_factor = 1.0, eps = 0.001, dtype = float32>
// CHECK-NEXT: }

// GENERIC:      "builtin.module"() ({
// GENERIC-NEXT:   "k3.latent_moe"() <{sym_name = "latent", hidden_size = 7168 : i64, latent_dim = 3584 : i64, num_experts = 896 : i64, top_k = 16 : i64, expert_ffn_dim = 3072 : i64, num_shared_experts = 2 : i64, shared_ffn_dim = 3072 : i64, activation = #k3<glu_activation situ_glu>, norm_topk_prob = true, routed_scaling_factor = 2.500000e+00 : f64, eps = 1.000000e-04 : f64, dtype = #k3<dtype bfloat16>}> : () -> ()
// GENERIC-NEXT:   "k3.latent_moe"() <{sym_name = "full", hidden_size = 256 : i64, latent_dim = 0 : i64, num_experts = 8 : i64, top_k = 2 : i64, expert_ffn_dim = 128 : i64, num_shared_experts = 0 : i64, shared_ffn_dim = 0 : i64, activation = #k3<glu_activation swiglu>, norm_topk_prob = false, routed_scaling_factor = 1.000000e+00 : f64, eps = 1.000000e-03 : f64, dtype = #k3<dtype float32>}> : () -> ()
// GENERIC-NEXT: }) : () -> ()
