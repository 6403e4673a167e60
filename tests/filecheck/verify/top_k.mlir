// A MoE cannot route each token to more experts than it has: top_k > num_experts is rejected
// (top_k == num_experts is fine).
// RUN: not k3c opt %s 2>&1 | filecheck %s --check-prefix=ERR
// RUN: sed 's/top_k = 9/top_k = 8/' %s | k3c opt - | filecheck %s --check-prefix=EQUAL

builtin.module {
  k3.latent_moe @moe <hidden_size = 64, latent_dim = 32, num_experts = 8, top_k = 9, expert_ffn_dim = 32, num_shared_experts = 0, shared_ffn_dim = 0, activation = swiglu, norm_topk_prob = true, routed_scaling_factor = 1.0, eps = 0.001, dtype = float32>
}

// ERR-NOT: {{\n}}
// ERR: {{^}}k3c opt: error: {{.*}}top_k.mlir: k3.latent_moe @moe: top_k (9) must not exceed num_experts (8){{$}}
// ERR-NOT: {{.}}

// EQUAL: k3.latent_moe @moe <{{.*}} num_experts = 8, top_k = 8,
