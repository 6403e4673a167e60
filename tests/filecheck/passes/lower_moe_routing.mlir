// lower-moe-routing: the latent_moe op stays and a `route` entry is added after it, with two
// kernels that hand the logits over in the `partial_logits` workspace [HS, R, E] fp32 (HS the
// call's slices of the hidden columns, chosen by legalize-triton): the logits kernel over
// blocks of experts x blocks of token rows x hidden slices (the router logits of its rows
// against its experts over its slice's columns, stored as its slice's partial logits), then the
// top-k kernel over blocks of token rows (every expert's partial logits summed over the slices,
// their sigmoid, the top-k selection by score + bias (ids and unbiased weights), the weights
// normalised (norm_topk_prob) and scaled (routed_scaling_factor), the store). The stages take
// the entry's arguments they read or write as operands. Without norm_topk_prob the weights are
// only scaled.
// RUN: k3c opt %s -p lower-moe-routing | filecheck %s
// RUN: k3c opt %s -p lower-moe-routing | k3c opt - | filecheck %s
// RUN: k3c opt %s -p lower-moe-routing --generic | k3c opt - | filecheck %s
// RUN: k3c opt %s -p 'lower-moe-routing{num-warps=4}' | filecheck %s --check-prefix=WARPS
// RUN: sed 's/norm_topk_prob = true, routed_scaling_factor = 2.5/norm_topk_prob = false, routed_scaling_factor = 1.0/' %s | k3c opt - -p lower-moe-routing | filecheck %s --check-prefix=RAW

builtin.module {
  k3.latent_moe @moe <hidden_size = 40, latent_dim = 16, num_experts = 12, top_k = 3, expert_ffn_dim = 32, num_shared_experts = 1, shared_ffn_dim = 32, activation = situ_glu, norm_topk_prob = true, routed_scaling_factor = 2.5, eps = 1.0e-06, dtype = bfloat16>
}

// CHECK:      builtin.module {
// CHECK-NEXT:   k3.latent_moe @moe <hidden_size = 40, latent_dim = 16, num_experts = 12, top_k = 3,
// CHECK-NEXT:   k3s.entry @route <source = @moe> {
// CHECK-NEXT:     %x = k3s.tensor_arg @x <role = input> : !k3s.tensor<R x 40, float>
// CHECK-NEXT:     %router_weight = k3s.tensor_arg @router_weight <role = input> : !k3s.tensor<12 x 40, float>
// CHECK-NEXT:     %router_bias = k3s.tensor_arg @router_bias <role = input> : !k3s.tensor<12, float32>
// CHECK-NEXT:     %topk_ids = k3s.tensor_arg @topk_ids <role = output> : !k3s.tensor<R x 3, index>
// CHECK-NEXT:     %topk_weights = k3s.tensor_arg @topk_weights <role = output> : !k3s.tensor<R x 3, float32>
// CHECK-NEXT:     %partial_logits = k3s.tensor_arg @partial_logits <role = workspace> : !k3s.tensor<HS x R x 12, float32>
// CHECK-NEXT:     k3s.kernel @moe_router_logits <grid = [expert_block, row_block, hidden_slice], num_warps = 8> {
// CHECK-NEXT:       %logits = k3s.router_logits %x, %router_weight <hidden_size = 40, num_experts = 12> : !k3s.tile<R x E>
// CHECK-NEXT:       k3s.store_partial_logits %logits, %partial_logits
// CHECK-NEXT:     }
// CHECK-NEXT:     k3s.kernel @moe_router_top_k <grid = [row_block], num_warps = 8> {
// CHECK-NEXT:       %logits = k3s.sum_partial_logits %partial_logits <num_experts = 12> : !k3s.tile<R x E>
// CHECK-NEXT:       %s = k3s.router_sigmoid %logits : !k3s.tile<R x E>
// CHECK-NEXT:       %ids, %w = k3s.select_top_k %s, %router_bias <top_k = 3> : !k3s.tile<R x KS>, !k3s.tile<R x KS>
// CHECK-NEXT:       %weights = k3s.routing_weights %w <normalize = true, scale = 2.5> : !k3s.tile<R x KS>
// CHECK-NEXT:       k3s.store_routing %ids, %weights, %topk_ids, %topk_weights
// CHECK-NEXT:     }
// CHECK-NEXT:   }
// CHECK-NEXT: }

// WARPS: k3s.kernel @moe_router_logits <grid = [expert_block, row_block, hidden_slice], num_warps = 4> {
// WARPS: k3s.kernel @moe_router_top_k <grid = [row_block], num_warps = 4> {

// RAW: %weights = k3s.routing_weights %w <normalize = false, scale = 1.0> : !k3s.tile<R x KS>
