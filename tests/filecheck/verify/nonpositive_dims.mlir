// Non-positive sizes are rejected, one property at a time: each RUN line breaks one size of
// this (valid) module with sed and checks the one-line error naming op, property and value.
// RUN: k3c opt %s | filecheck %s --check-prefix=VALID
// RUN: sed 's/num_heads = 4/num_heads = 0/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=HEADS
// RUN: sed 's/head_k_dim = 64/head_k_dim = -64/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=HEADK
// RUN: sed 's/head_v_dim = 64/head_v_dim = 0/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=HEADV
// RUN: sed 's/num_v_heads = 4/num_v_heads = 0/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=VHEADS
// RUN: sed 's/hidden_size = 96,/hidden_size = 0,/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=HIDDEN
// RUN: sed 's/num_blocks = 2/num_blocks = -1/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=BLOCKS
// RUN: sed 's/block_size = 3/block_size = 0/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=BSIZE
// RUN: sed 's/num_experts = 4/num_experts = 0/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=EXPERTS
// RUN: sed 's/expert_ffn_dim = 32/expert_ffn_dim = 0/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=FFN
// RUN: sed 's/latent_dim = 32/latent_dim = -1/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=LATENT
// RUN: sed 's/shared_ffn_dim = 32/shared_ffn_dim = 0/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=SHARED
// RUN: sed 's/scale = 0.125/scale = -0.125/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=SCALE
// RUN: sed 's/eps = 0.001, dtype = float32> \/\/ attnres/eps = 0.0, dtype = float32>/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=EPS

builtin.module {
  k3.recurrence @r <gate = channel, delta_rule = true, num_heads = 4, num_v_heads = 4, head_k_dim = 64, head_v_dim = 64, scale = 0.125, state_layout = kv, dtype = float32>
  k3.attnres @ar <hidden_size = 96, num_blocks = 2, block_size = 3, eps = 0.001, dtype = float32> // attnres
  k3.latent_moe @moe <hidden_size = 64, latent_dim = 32, num_experts = 4, top_k = 2, expert_ffn_dim = 32, num_shared_experts = 1, shared_ffn_dim = 32, activation = swiglu, norm_topk_prob = true, routed_scaling_factor = 1.0, eps = 0.001, dtype = float32>
}

// VALID: k3.recurrence @r
// VALID: k3.attnres @ar
// VALID: k3.latent_moe @moe

// HEADS-NOT: {{\n}}
// HEADS: {{^}}k3c opt: error: <stdin>: k3.recurrence @r: num_heads must be positive, got 0{{$}}
// HEADS-NOT: {{.}}
// HEADK-NOT: {{\n}}
// HEADK: {{^}}k3c opt: error: <stdin>: k3.recurrence @r: head_k_dim must be positive, got -64{{$}}
// HEADK-NOT: {{.}}
// HEADV-NOT: {{\n}}
// HEADV: {{^}}k3c opt: error: <stdin>: k3.recurrence @r: head_v_dim must be positive, got 0{{$}}
// HEADV-NOT: {{.}}
// VHEADS-NOT: {{\n}}
// VHEADS: {{^}}k3c opt: error: <stdin>: k3.recurrence @r: num_v_heads must be positive, got 0{{$}}
// VHEADS-NOT: {{.}}
// HIDDEN-NOT: {{\n}}
// HIDDEN: {{^}}k3c opt: error: <stdin>: k3.attnres @ar: hidden_size must be positive, got 0{{$}}
// HIDDEN-NOT: {{.}}
// BLOCKS-NOT: {{\n}}
// BLOCKS: {{^}}k3c opt: error: <stdin>: k3.attnres @ar: num_blocks must be positive, got -1{{$}}
// BLOCKS-NOT: {{.}}
// BSIZE-NOT: {{\n}}
// BSIZE: {{^}}k3c opt: error: <stdin>: k3.attnres @ar: block_size must be positive, got 0{{$}}
// BSIZE-NOT: {{.}}
// EXPERTS-NOT: {{\n}}
// EXPERTS: {{^}}k3c opt: error: <stdin>: k3.latent_moe @moe: num_experts must be positive, got 0{{$}}
// EXPERTS-NOT: {{.}}
// FFN-NOT: {{\n}}
// FFN: {{^}}k3c opt: error: <stdin>: k3.latent_moe @moe: expert_ffn_dim must be positive, got 0{{$}}
// FFN-NOT: {{.}}
// LATENT-NOT: {{\n}}
// LATENT: {{^}}k3c opt: error: <stdin>: k3.latent_moe @moe: latent_dim must be >= 0, got -1{{$}}
// LATENT-NOT: {{.}}
// SHARED-NOT: {{\n}}
// SHARED: {{^}}k3c opt: error: <stdin>: k3.latent_moe @moe: shared_ffn_dim must be positive when num_shared_experts > 0{{$}}
// SHARED-NOT: {{.}}
// SCALE-NOT: {{\n}}
// SCALE: {{^}}k3c opt: error: <stdin>: k3.recurrence @r: scale must be > 0.0, got -0.125{{$}}
// SCALE-NOT: {{.}}
// EPS-NOT: {{\n}}
// EPS: {{^}}k3c opt: error: <stdin>: k3.attnres @ar: eps must be > 0.0, got 0.0{{$}}
// EPS-NOT: {{.}}
