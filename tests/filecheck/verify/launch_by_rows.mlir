// k3s.launch_by_rows names a kernel before it in its entry, a positive max_rows that increases
// along that kernel's launches, block sizes that are powers of two and a positive count of
// hidden slices; k3s.router_logits sums over its program's hidden slice, so its kernel has a
// hidden_slice grid axis.
// RUN: k3c opt %s | filecheck %s --check-prefix=OK
// RUN: sed 's/kernel = @moe_router_top_k, max_rows = 64/kernel = @moe_router_top, max_rows = 64/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=KERNEL
// RUN: sed 's/max_rows = 256/max_rows = 64/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=ORDER
// RUN: sed 's/max_rows = 64, block_r = 1/max_rows = 0, block_r = 1/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=ROWS
// RUN: sed 's/block_r = 1>/block_r = 3>/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=POW2
// RUN: sed 's/hidden_slices = 3>/hidden_slices = 0>/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=SLICES
// RUN: sed 's/grid = \[expert_block, row_block, hidden_slice\]/grid = [expert_block, row_block]/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=AXIS

builtin.module {
  k3.latent_moe @moe <hidden_size = 400, latent_dim = 200, num_experts = 12, top_k = 3, expert_ffn_dim = 64, num_shared_experts = 1, shared_ffn_dim = 64, activation = swiglu, norm_topk_prob = true, routed_scaling_factor = 1.0, eps = 1.0e-06, dtype = float32>
  k3s.entry @route <source = @moe> {
    %x = k3s.tensor_arg @x <role = input> : !k3s.tensor<R x 400, float>
    %router_weight = k3s.tensor_arg @router_weight <role = input> : !k3s.tensor<12 x 400, float>
    %router_bias = k3s.tensor_arg @router_bias <role = input> : !k3s.tensor<12, float32>
    %topk_ids = k3s.tensor_arg @topk_ids <role = output> : !k3s.tensor<R x 3, index>
    %topk_weights = k3s.tensor_arg @topk_weights <role = output> : !k3s.tensor<R x 3, float32>
    %partial_logits = k3s.tensor_arg @partial_logits <role = workspace> : !k3s.tensor<HS x R x 12, float32>
    k3s.kernel @moe_router_logits <grid = [expert_block, row_block, hidden_slice], num_warps = 8, block_d = 64, block_r = 128, block_e = 16, hidden_slices = 1> {
      %logits = k3s.router_logits %x, %router_weight <hidden_size = 400, num_experts = 12> : !k3s.tile<R x E>
      k3s.store_partial_logits %logits, %partial_logits
    }
    k3s.launch_by_rows <kernel = @moe_router_logits, max_rows = 16, block_r = 16, hidden_slices = 3>
    k3s.kernel @moe_router_top_k <grid = [row_block], num_warps = 8, block_r = 16, block_e = 16, block_ks = 4> {
      %summed = k3s.sum_partial_logits %partial_logits <num_experts = 12> : !k3s.tile<R x E>
      %s = k3s.router_sigmoid %summed : !k3s.tile<R x E>
      %ids, %w = k3s.select_top_k %s, %router_bias <top_k = 3> : !k3s.tile<R x KS>, !k3s.tile<R x KS>
      k3s.store_routing %ids, %w, %topk_ids, %topk_weights
    }
    k3s.launch_by_rows <kernel = @moe_router_top_k, max_rows = 64, block_r = 1>
    k3s.launch_by_rows <kernel = @moe_router_top_k, max_rows = 256, block_r = 4>
  }
}

// OK: k3s.launch_by_rows <kernel = @moe_router_logits, max_rows = 16, block_r = 16, hidden_slices = 3>
// OK: k3s.launch_by_rows <kernel = @moe_router_top_k, max_rows = 64, block_r = 1>
// OK-NEXT: k3s.launch_by_rows <kernel = @moe_router_top_k, max_rows = 256, block_r = 4>
// KERNEL: k3s.launch_by_rows <kernel = @moe_router_top, max_rows = 64>: no kernel @moe_router_top launched before it in its entry
// ORDER: k3s.launch_by_rows <kernel = @moe_router_top_k, max_rows = 64>: max_rows must increase along a kernel's launch_by_rows ops
// ROWS: k3s.launch_by_rows <kernel = @moe_router_top_k, max_rows = 0>: max_rows must be positive
// POW2: k3s.launch_by_rows <kernel = @moe_router_top_k, max_rows = 64>: block_r must be a power of two, got 3
// SLICES: k3s.launch_by_rows <kernel = @moe_router_logits, max_rows = 16>: hidden_slices must be positive, got 0
// AXIS: k3s.router_logits in @moe_router_logits: its kernel's grid has no hidden_slice axis
