// derive-moe-backward: moe_forward (the expert-centric plan returning what the backward reads:
// the routing, h, the pair list (in pair order within each expert's run: ranks counted per chunk
// of pairs, no atomic return value), the GLU pre-activations in the weight's row order and
// outputs, the combined rows, the shared experts') and moe_backward, its kernels derived by the adjoint
// rules in reverse of the forward's: each projection a wgrad and a dgrad GEMM, the GLU's adjoint
// in the epilogue of the dgrad that made its output's cotangent (the routing weights' partial
// row dots there too), the RMSNorm's adjoint and gain gradient after the latent up-projection's
// dgrad, the token's rows from its pairs summed over its slots, the router's stages recomputed
// and differentiated, x's gradient accumulated in a fixed order.
// RUN: k3c opt %s -p lower-moe-routing,lower-moe-experts,derive-moe-backward | filecheck %s
// RUN: k3c opt %s -p lower-moe-routing,lower-moe-experts,derive-moe-backward | k3c opt - | filecheck %s
// RUN: k3c opt %s -p lower-moe-routing,derive-moe-backward,derive-moe-backward | filecheck %s --check-prefix=ONCE
// RUN: k3c opt %s -p 'lower-moe-routing,derive-moe-backward{block-rows=16 glu-dgrad-block-n=16}' | filecheck %s --check-prefix=OPTS
// RUN: sed 's/latent_dim = 16/latent_dim = 0/; s/num_shared_experts = 1/num_shared_experts = 0/' %s | k3c opt - -p lower-moe-routing,derive-moe-backward | filecheck %s --check-prefix=PLAIN
// RUN: sed 's/latent_dim = 16/latent_dim = 32/; s/dtype = bfloat16/dtype = bfloat16, expert_weight_format = mxfp4/' %s | k3c opt - -p lower-moe-routing,lower-moe-experts,derive-moe-backward | filecheck %s --check-prefix=MXFP4
// RUN: not k3c opt %s -p 'derive-moe-backward{block-rows=24}' 2>&1 | filecheck %s --check-prefix=BAD

builtin.module {
  k3.latent_moe @mlp <hidden_size = 40, latent_dim = 16, num_experts = 12, top_k = 3, expert_ffn_dim = 32, num_shared_experts = 1, shared_ffn_dim = 24, activation = situ_glu, norm_topk_prob = true, routed_scaling_factor = 2.5, eps = 1.0e-06, dtype = bfloat16>
}

// CHECK:      k3s.entry @moe_forward <source = @mlp> {
// CHECK:        k3s.tensor_arg @out <role = output> : !k3s.tensor<R x 40, float>
// CHECK-NEXT:   k3s.tensor_arg @topk_ids <role = output> : !k3s.tensor<R x 3, index>
// CHECK-NEXT:   k3s.tensor_arg @topk_weights <role = output> : !k3s.tensor<R x 3, float32>
// CHECK:        k3s.tensor_arg @h <role = output> : !k3s.tensor<R x 16, float>
// CHECK:        k3s.tensor_arg @sorted_pairs <role = output, fill = -1> : !k3s.tensor<PP, index>
// CHECK:        k3s.tensor_arg @expert_gu <role = output> : !k3s.tensor<PP x 64, float>
// CHECK-NEXT:   k3s.tensor_arg @expert_act <role = output> : !k3s.tensor<PP x 32, float>
// CHECK:        k3s.tensor_arg @combined <role = output> : !k3s.tensor<R x 16, float32>
// CHECK-NEXT:   k3s.tensor_arg @chunk_counts <role = workspace, fill = 0> : !k3s.tensor<PB x 12, index>
// CHECK-NEXT:   k3s.tensor_arg @shared_act <role = output> : !k3s.tensor<R x 24, float>
// CHECK-NEXT:   k3s.tensor_arg @shared_gu <role = output> : !k3s.tensor<R x 48, float>
// CHECK:        k3s.kernel @mlp_forward_rank_pairs <grid = [pair_chunk], num_warps = 8, block_r = 128> {
// CHECK-NEXT:     k3s.rank_pairs %topk_ids, %chunk_counts, %pair_rank <num_experts = 12, top_k = 3, pairs_per_chunk = 128>
// CHECK:        k3s.kernel @mlp_forward_chunk_offsets <grid = [one]
// CHECK-NEXT:     k3s.chunk_offsets %chunk_counts, %expert_counts <num_experts = 12, top_k = 3, pairs_per_chunk = 128>
// CHECK:          k3s.expert_offsets %expert_counts, %expert_offsets
// CHECK:          k3s.sort_pairs %topk_ids, %expert_offsets, %pair_rank, %sorted_pairs, %block_expert, %chunk_counts <top_k = 3, block_rows = 128, pairs_per_chunk = 128>
// CHECK:        k3s.kernel @mlp_forward_expert_gate_up
// CHECK:          k3s.store_glu_halves %g, %u, %expert_gu <rows = sorted_block, index = position, group = 32, width = 64>

// CHECK:      k3s.entry @moe_backward <source = @mlp> {
// CHECK:        k3s.tensor_arg @shared_gu <role = input> : !k3s.tensor<R x 48, float>
// CHECK-NEXT:   k3s.tensor_arg @dout <role = input> : !k3s.tensor<R x 40, float>
// CHECK-NEXT:   k3s.tensor_arg @dx <role = output, fill = 0> : !k3s.tensor<R x 40, float32>
// CHECK-NEXT:   k3s.tensor_arg @drouter_weight <role = output> : !k3s.tensor<12 x 40, float>
// CHECK:        k3s.tensor_arg @dlatent_norm_gain <role = output> : !k3s.tensor<16, float32>
// CHECK:        k3s.tensor_arg @shared_gate_up_out_bar <role = workspace> : !k3s.tensor<R x 48, float>
// CHECK:        k3s.tensor_arg @combined_bar <role = workspace> : !k3s.tensor<R x 16, float>
// CHECK:        k3s.tensor_arg @topk_weights_bar_partials <role = workspace> : !k3s.tensor<R x 3 x 1, float32>
// CHECK:        k3s.tensor_arg @h_bar <role = workspace> : !k3s.tensor<R x 16, float>
// the weight gradients' fastest grid axis is over the operand with the narrower rows in bytes
// (shared_act 24 < dout 40 columns); an expert's programs run together (expert slowest)
// CHECK:        k3s.kernel @mlp_backward_shared_down_wgrad <grid = [input_block, column_block], num_warps = 8, num_stages = 3, block_d = 32, block_r = 64, block_n = 64>
// CHECK-NEXT:     k3s.project_weight_grad %dout, %shared_act <in_dim = 24, out_dim = 40, rows = token_block, cotangent_index = token, input_index = token, scale_rows = false>
// CHECK-NEXT:     k3s.store_weight_grad %w_bar, %dshared_down <layout = stacked_in, group = 24>
// a dgrad with a GLU's adjoint in its epilogue takes glu-dgrad-block-n columns
// CHECK:        k3s.kernel @mlp_backward_shared_down_dgrad <grid = [row_block, column_block], num_warps = 8, num_stages = 3, block_d = 64, block_r = 128, block_n = 32>
// CHECK-NEXT:     %a_bar = k3s.project_input_grad %dout, %shared_down <in_dim = 40, out_dim = 24, rows = token_block, input_index = token, layout = stacked_in, group = 24>
// CHECK-NEXT:     %g, %u = k3s.load_glu_halves %shared_gu <rows = token_block, index = token, group = 24, width = 48>
// CHECK-NEXT:     %g_bar, %u_bar = k3s.glu_adjoint %g, %u, %a_bar <activation = situ_glu>
// CHECK-NEXT:     k3s.store_glu_halves %g_bar, %u_bar, %shared_gate_up_out_bar
// CHECK:        k3s.kernel @mlp_backward_shared_gate_up_dgrad
// CHECK-NEXT:     k3s.project_input_grad %shared_gate_up_out_bar, %shared_gate_up <in_dim = 48, out_dim = 40, rows = token_block, input_index = token, layout = dense>
// CHECK-NEXT:     k3s.store_rows %a_bar, %dx <rows = token_block, index = token, width = 40, accumulate = true>
// CHECK:        k3s.kernel @mlp_backward_latent_up_dgrad
// CHECK:        k3s.kernel @mlp_backward_combined_rms_norm_adjoint <grid = [row_block]
// CHECK-NEXT:     k3s.rms_norm_adjoint %combined, %latent_norm_gain, %combined_normed_bar, %combined_bar, %combined_rstd, %combined_normed <eps = 1.0e-06, width = 16>
// CHECK:        k3s.kernel @mlp_backward_latent_norm_gain_grad <grid = [column_block]
// CHECK:        k3s.kernel @mlp_backward_latent_up_wgrad
// CHECK-NEXT:     k3s.project_weight_grad %dout, %combined_normed <in_dim = 16, out_dim = 40, rows = token_block, cotangent_index = token, input_index = token, scale_rows = false>
// CHECK:        k3s.kernel @mlp_backward_expert_down_wgrad <grid = [column_block, input_block, expert], num_warps = 8, num_stages = 5,
// CHECK-NEXT:     k3s.project_weight_grad %combined_bar, %expert_act, %topk_weights, %expert_offsets, %sorted_pairs <in_dim = 32, out_dim = 16, rows = sorted_block, cotangent_index = token, input_index = position, scale_rows = true, block_rows = 128>
// over the pair list, the columns fastest: the programs running together share a block's rows
// CHECK:        k3s.kernel @mlp_backward_expert_down_dgrad <grid = [column_block, sorted_block]
// CHECK-NEXT:     %yw_bar_w = k3s.project_input_grad %combined_bar, %expert_down, %expert_offsets, %sorted_pairs, %block_expert <in_dim = 16, out_dim = 32, rows = sorted_block, input_index = token, layout = expert, block_rows = 128>
// CHECK-NEXT:     %a = k3s.load_rows %expert_act <rows = sorted_block, index = position, width = 32>
// CHECK-NEXT:     k3s.store_pair_dot %yw_bar_w, %a, %topk_weights_bar_partials
// CHECK-NEXT:     %a_bar = k3s.weigh_pairs %yw_bar_w, %topk_weights
// CHECK-NEXT:     %g, %u = k3s.load_glu_halves %expert_gu <rows = sorted_block, index = position, group = 32, width = 64>
// CHECK-NEXT:     %g_bar, %u_bar = k3s.glu_adjoint %g, %u, %a_bar <activation = situ_glu>
// CHECK-NEXT:     k3s.store_glu_halves %g_bar, %u_bar, %expert_gate_up_out_bar <rows = sorted_block, index = position, group = 32, width = 64>
// CHECK:        k3s.kernel @mlp_backward_expert_gate_up_dgrad
// CHECK-NEXT:     k3s.project_input_grad %expert_gate_up_out_bar, %expert_gate_up, {{.*}} <in_dim = 64, out_dim = 16, rows = sorted_block, input_index = position, layout = expert, block_rows = 128>
// CHECK-NEXT:     k3s.store_rows %a_bar, %h_pair_bar <rows = sorted_block, index = pair, width = 16, accumulate = false>
// CHECK:        k3s.kernel @mlp_backward_h_sum_slots
// CHECK-NEXT:     %c = k3s.sum_slots %h_pair_bar <out_dim = 16, top_k = 3>
// CHECK-NEXT:     k3s.store_rows %c, %h_bar <rows = token_block, index = token, width = 16, accumulate = false>
// CHECK:        k3s.kernel @mlp_backward_expert_gate_up_wgrad <grid = [input_block, column_block, expert]
// CHECK:        k3s.kernel @mlp_backward_latent_down_dgrad
// CHECK:          k3s.store_rows %a_bar, %dx <rows = token_block, index = token, width = 40, accumulate = true>
// CHECK:        k3s.kernel @mlp_backward_latent_down_wgrad
// CHECK:        k3s.kernel @mlp_backward_router_logits <grid = [expert_block, row_block, hidden_slice]
// CHECK:        k3s.kernel @mlp_backward_router <grid = [row_block]
// CHECK-NEXT:     k3s.sum_partial_logits %partial_logits
// CHECK-NEXT:     k3s.router_sigmoid
// CHECK-NEXT:     %ids, %w = k3s.select_top_k %s, %router_bias <top_k = 3>
// CHECK-NEXT:     %weights_bar = k3s.sum_partials %topk_weights_bar_partials
// CHECK-NEXT:     %w_bar = k3s.routing_weights_adjoint %w, %weights_bar <normalize = true, scale = 2.5>
// CHECK-NEXT:     %s_bar = k3s.select_top_k_adjoint %ids, %w_bar
// CHECK-NEXT:     k3s.router_sigmoid_adjoint %s, %s_bar
// CHECK-NEXT:     k3s.store_logits
// CHECK:        k3s.kernel @mlp_backward_router_weight_dgrad
// CHECK:          k3s.store_rows %a_bar, %dx <rows = token_block, index = token, width = 40, accumulate = true>
// CHECK:        k3s.kernel @mlp_backward_router_weight_wgrad

// ONCE-COUNT-1: k3s.entry @moe_forward
// ONCE-COUNT-1: k3s.entry @moe_backward

// OPTS:       k3s.tensor_arg @topk_weights_bar_partials <role = workspace> : !k3s.tensor<R x 3 x 2, float32>
// OPTS:       k3s.project_input_grad %combined_bar, %expert_down, {{.*}} block_rows = 16>

// PLAIN:      k3s.entry @moe_backward
// PLAIN-NOT:  k3s.kernel @mlp_backward_{{(latent|shared|combined)}}
// PLAIN:      k3s.kernel @mlp_backward_x_sum_slots
// PLAIN-NEXT:   %c = k3s.sum_slots %x_pair_bar <out_dim = 40, top_k = 3>
// PLAIN-NEXT:   k3s.store_rows %c, %dx <rows = token_block, index = token, width = 40, accumulate = true>

// MXFP4:      k3s.entry @moe_prefill
// MXFP4-NOT:  moe_forward
// MXFP4-NOT:  moe_backward

// BAD: derive-moe-backward: block-rows must be a power of two in 1..256, got 24
