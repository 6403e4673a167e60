// The latent width must be smaller than the model width (latent_dim = hidden_size is rejected,
// as is anything wider); latent_dim = 0 means no latent projection and is valid.
// RUN: not k3c opt %s 2>&1 | filecheck %s --check-prefix=ERR
// RUN: sed 's/latent_dim = 64/latent_dim = 128/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=WIDER
// RUN: sed 's/latent_dim = 64/latent_dim = 0/' %s | k3c opt - | filecheck %s --check-prefix=ZERO

builtin.module {
  k3.latent_moe @moe <hidden_size = 64, latent_dim = 64, num_experts = 8, top_k = 2, expert_ffn_dim = 32, num_shared_experts = 0, shared_ffn_dim = 0, activation = situ_glu, norm_topk_prob = true, routed_scaling_factor = 1.0, eps = 0.001, dtype = float32>
}

// ERR-NOT: {{\n}}
// ERR: {{^}}k3c opt: error: {{.*}}latent_dim.mlir: k3.latent_moe @moe: latent_dim (64) must be smaller than hidden_size (64), or 0 for no latent projection{{$}}
// ERR-NOT: {{.}}

// WIDER-NOT: {{\n}}
// WIDER: {{^}}k3c opt: error: <stdin>: k3.latent_moe @moe: latent_dim (128) must be smaller than hidden_size (64), or 0 for no latent projection{{$}}
// WIDER-NOT: {{.}}

// ZERO: k3.latent_moe @moe <hidden_size = 64, latent_dim = 0,
