// lower-recurrent's options. Several options go in one brace pair separated by spaces (xDSL's
// pipeline syntax); block-v sets the state tile's V block, num-warps the kernel's warps.
// RUN: k3c opt %s -p 'lower-recurrent{block-v=64 num-warps=8}' | filecheck %s --check-prefix=BOTH
// RUN: k3c opt %s -p 'lower-recurrent{block-v=16}' | filecheck %s --check-prefix=BLOCK
// RUN: k3c opt %s -p 'lower-recurrent{num-warps=2}' | filecheck %s --check-prefix=WARPS
// RUN: k3c opt %s -p 'lower-recurrent{block-v=64 num-warps=8}' | k3c opt - | filecheck %s --check-prefix=BOTH
// token-stages asks Triton to pipeline the token loop (the kernel's num_stages; absent: no prefetch)
// RUN: k3c opt %s -p 'lower-recurrent{token-stages=3}' | filecheck %s --check-prefix=STAGES
// RUN: not k3c opt %s -p 'lower-recurrent{token-stages=-1}' 2>&1 | filecheck %s --check-prefix=NEGATIVE

builtin.module {
  k3.recurrence @kda <gate = channel, delta_rule = true, num_heads = 4, num_v_heads = 4, head_k_dim = 64, head_v_dim = 128, scale = 0.125, state_layout = kv, dtype = bfloat16>
}

// BOTH:      k3s.kernel @kda_recurrent <grid = [value_block, sequence_head], num_warps = 8> {
// BOTH-NEXT:   k3s.state_tile %initial_state <head_k_dim = 64, head_v_dim = 128, block_v = 64, layout = kv>

// BLOCK:      k3s.kernel @kda_recurrent <grid = [value_block, sequence_head], num_warps = 4> {
// BLOCK-NEXT:   k3s.state_tile %initial_state <head_k_dim = 64, head_v_dim = 128, block_v = 16, layout = kv>

// WARPS:      k3s.kernel @kda_recurrent <grid = [value_block, sequence_head], num_warps = 2> {
// WARPS-NEXT:   k3s.state_tile %initial_state <head_k_dim = 64, head_v_dim = 128, block_v = 32, layout = kv>

// STAGES:      k3s.kernel @kda_recurrent <grid = [value_block, sequence_head], num_warps = 4, num_stages = 3> {

// NEGATIVE: lower-recurrent: token-stages must be >= 0 (0: no prefetch), got -1
