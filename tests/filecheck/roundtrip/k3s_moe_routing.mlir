// The MoE routing as legalize-triton leaves it: the logits kernel (its hidden slices too) and
// the top-k kernel with their block sizes, each followed by its k3s.launch_by_rows ops (block
// sizes, and the logits kernel's hidden slices, for calls of at most max_rows token rows). The
// stages take the entry's arguments they read or write as operands. Parses, verifies and prints
// back the same, also through the generic form.
// RUN: k3c opt %s | filecheck %s
// RUN: k3c opt %s --generic | k3c opt - | filecheck %s
// RUN: k3c opt %s > %t.once && k3c opt %t.once > %t.twice && diff %t.once %t.twice

builtin.module {
  k3.latent_moe @moe <hidden_size = 40, latent_dim = 16, num_experts = 12, top_k = 3, expert_ffn_dim = 32, num_shared_experts = 1, shared_ffn_dim = 32, activation = situ_glu, norm_topk_prob = true, routed_scaling_factor = 2.5, eps = 1.0e-06, dtype = bfloat16>
  k3s.entry @route <source = @moe> {
    %x = k3s.tensor_arg @x <role = input> : !k3s.tensor<R x 40, float>
    %router_weight = k3s.tensor_arg @router_weight <role = input> : !k3s.tensor<12 x 40, float>
    %router_bias = k3s.tensor_arg @router_bias <role = input> : !k3s.tensor<12, float32>
    %topk_ids = k3s.tensor_arg @topk_ids <role = output> : !k3s.tensor<R x 3, index>
    %topk_weights = k3s.tensor_arg @topk_weights <role = output> : !k3s.tensor<R x 3, float32>
    %partial_logits = k3s.tensor_arg @partial_logits <role = workspace> : !k3s.tensor<HS x R x 12, float32>
    k3s.kernel @moe_router_logits <grid = [expert_block, row_block, hidden_slice], num_warps = 8, block_d = 64, block_r = 128, block_e = 16, hidden_slices = 1> {
      %logits = k3s.router_logits %x, %router_weight <hidden_size = 40, num_experts = 12> : !k3s.tile<R x E>
      k3s.store_partial_logits %logits, %partial_logits
    }
    k3s.launch_by_rows <kernel = @moe_router_logits, max_rows = 16, block_r = 16, block_e = 16, block_d = 16, hidden_slices = 3>
    k3s.launch_by_rows <kernel = @moe_router_logits, max_rows = 512, block_r = 32>
    k3s.kernel @moe_router_top_k <grid = [row_block], num_warps = 8, block_r = 16, block_e = 16, block_ks = 4> {
      %summed = k3s.sum_partial_logits %partial_logits <num_experts = 12> : !k3s.tile<R x E>
      %s = k3s.router_sigmoid %summed : !k3s.tile<R x E>
      %ids, %w = k3s.select_top_k %s, %router_bias <top_k = 3> : !k3s.tile<R x KS>, !k3s.tile<R x KS>
      %weights = k3s.routing_weights %w <normalize = true, scale = 2.5> : !k3s.tile<R x KS>
      k3s.store_routing %ids, %weights, %topk_ids, %topk_weights
    }
    k3s.launch_by_rows <kernel = @moe_router_top_k, max_rows = 256, block_r = 1>
  }
}

// CHECK:      %partial_logits = k3s.tensor_arg @partial_logits <role = workspace> : !k3s.tensor<HS x R x 12, float32>
// CHECK-NEXT: k3s.kernel @moe_router_logits <grid = [expert_block, row_block, hidden_slice], num_warps = 8, block_d = 64, block_r = 128, block_e = 16, hidden_slices = 1> {
// CHECK-NEXT:   %logits = k3s.router_logits %x, %router_weight <hidden_size = 40, num_experts = 12> : !k3s.tile<R x E>
// CHECK-NEXT:   k3s.store_partial_logits %logits, %partial_logits
// CHECK-NEXT: }
// CHECK-NEXT: k3s.launch_by_rows <kernel = @moe_router_logits, max_rows = 16, block_r = 16, block_e = 16, block_d = 16, hidden_slices = 3>
// CHECK-NEXT: k3s.launch_by_rows <kernel = @moe_router_logits, max_rows = 512, block_r = 32>
// CHECK-NEXT: k3s.kernel @moe_router_top_k <grid = [row_block], num_warps = 8, block_r = 16, block_e = 16, block_ks = 4> {
// CHECK-NEXT:   %summed = k3s.sum_partial_logits %partial_logits <num_experts = 12> : !k3s.tile<R x E>
// CHECK-NEXT:   %s = k3s.router_sigmoid %summed : !k3s.tile<R x E>
// CHECK-NEXT:   %ids, %w = k3s.select_top_k %s, %router_bias <top_k = 3> : !k3s.tile<R x KS>, !k3s.tile<R x KS>
// CHECK-NEXT:   %weights = k3s.routing_weights %w <normalize = true, scale = 2.5> : !k3s.tile<R x KS>
// CHECK-NEXT:   k3s.store_routing %ids, %weights, %topk_ids, %topk_weights
// CHECK-NEXT: }
// CHECK:      k3s.launch_by_rows <kernel = @moe_router_top_k, max_rows = 256, block_r = 1>
