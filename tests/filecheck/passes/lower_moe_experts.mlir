// lower-moe-experts: after the route entry, moe_prefill (expert-centric), moe_decode
// (token-centric) and moe (the choice by row count). The stages follow from the layer op:
// latent_dim > 0 brings the latent down-projection before the experts and the RMS-normalised
// up-projection after them; shared experts bring one dense GLU over all of them (stacked
// layouts) whose down projection adds to out; latent_dim = 0 and no shared experts leave the
// routed experts alone, writing out directly. The routing kernels (lower-moe-routing's) are
// renamed per entry.
// RUN: k3c opt %s -p lower-moe-routing,lower-moe-experts | filecheck %s
// RUN: k3c opt %s -p lower-moe-routing,lower-moe-experts | k3c opt - | filecheck %s
// RUN: k3c opt %s -p lower-moe-routing,lower-moe-experts,lower-moe-experts | filecheck %s --check-prefix=ONCE
// RUN: k3c opt %s -p 'lower-moe-routing,lower-moe-experts{block-rows=16 max-decode-rows=8}' | filecheck %s --check-prefix=OPTS
// RUN: sed 's/latent_dim = 16/latent_dim = 0/; s/num_shared_experts = 1/num_shared_experts = 0/' %s | k3c opt - -p lower-moe-routing,lower-moe-experts | filecheck %s --check-prefix=PLAIN
// RUN: not k3c opt %s -p 'lower-moe-experts{block-rows=24}' 2>&1 | filecheck %s --check-prefix=BAD

builtin.module {
  k3.latent_moe @mlp <hidden_size = 40, latent_dim = 16, num_experts = 12, top_k = 3, expert_ffn_dim = 32, num_shared_experts = 1, shared_ffn_dim = 24, activation = situ_glu, norm_topk_prob = true, routed_scaling_factor = 2.5, eps = 1.0e-06, dtype = bfloat16>
}

// CHECK:      k3s.entry @moe_prefill <source = mlp> {
// CHECK:        %expert_gate_up = k3s.tensor_arg @expert_gate_up <role = input> : !k3s.tensor<12 x 64 x 16, float>
// CHECK:        %out = k3s.tensor_arg @out <role = output> : !k3s.tensor<R x 40, float>
// CHECK:        %partial_logits = k3s.tensor_arg @partial_logits <role = workspace> : !k3s.tensor<HS x R x 12, float32>
// CHECK:        %expert_counts = k3s.tensor_arg @expert_counts <role = workspace, fill = 0> : !k3s.tensor<12, index>
// CHECK:        %sorted_pairs = k3s.tensor_arg @sorted_pairs <role = workspace, fill = -1> : !k3s.tensor<PP, index>
// CHECK:        k3s.kernel @mlp_prefill_router_logits <grid = "expert_block,row_block,hidden_slice", num_warps = 8> {
// CHECK:        k3s.kernel @mlp_prefill_router_top_k <grid = row_block, num_warps = 8> {
// CHECK:        k3s.kernel @mlp_prefill_latent_down <grid = "row_block,column_block", num_warps = 4> {
// CHECK-NEXT:     %y = k3s.project <input = x, weight = latent_down, in_dim = 40, out_dim = 16, rows = token_block, input_index = token, layout = dense, glu = false>
// CHECK-NEXT:     k3s.store_rows %y <tensor = h, rows = token_block, index = token, width = 16, accumulate = false>
// CHECK:        k3s.kernel @mlp_prefill_count_pairs <grid = pair_chunk, num_warps = 4> {
// CHECK-NEXT:     k3s.count_pairs <num_experts = 12, top_k = 3>
// CHECK:        k3s.kernel @mlp_prefill_expert_offsets <grid = one, num_warps = 4> {
// CHECK-NEXT:     k3s.expert_offsets <num_experts = 12, block_rows = 128>
// CHECK:        k3s.kernel @mlp_prefill_sort_pairs <grid = pair_chunk, num_warps = 4> {
// CHECK:        k3s.kernel @mlp_prefill_expert_gate_up <grid = "sorted_block,column_block", num_warps = 4> {
// CHECK-NEXT:     %g, %u = k3s.project <input = h, weight = expert_gate_up, in_dim = 16, out_dim = 32, rows = sorted_block, input_index = token, layout = expert, glu = true, block_rows = 128>
// CHECK-NEXT:     %act = k3s.glu %g, %u <activation = situ_glu>
// CHECK-NEXT:     k3s.store_rows %act <tensor = expert_act, rows = sorted_block, index = position, width = 32, accumulate = false>
// CHECK:        k3s.kernel @mlp_prefill_expert_down <grid = "sorted_block,column_block", num_warps = 4> {
// CHECK-NEXT:     %y = k3s.project <input = expert_act, weight = expert_down, in_dim = 32, out_dim = 16, rows = sorted_block, input_index = position, layout = expert, glu = false, block_rows = 128>
// CHECK-NEXT:     %yw = k3s.weigh_pairs %y
// CHECK-NEXT:     k3s.store_rows %yw <tensor = pair_out, rows = sorted_block, index = pair, width = 16, accumulate = false>
// CHECK:        k3s.kernel @mlp_prefill_combine <grid = "row_block,column_block", num_warps = 4> {
// CHECK-NEXT:     %c = k3s.sum_slots <input = pair_out, out_dim = 16, top_k = 3>
// CHECK-NEXT:     k3s.store_rows %c <tensor = combined, rows = token_block, index = token, width = 16, accumulate = false>
// CHECK:        k3s.kernel @mlp_prefill_latent_up <grid = "row_block,column_block", num_warps = 4> {
// CHECK-NEXT:     %y = k3s.project <input = combined, weight = latent_up, in_dim = 16, out_dim = 40, rows = token_block, input_index = token, layout = dense, glu = false, rms_eps = 1.0e-06, gain = latent_norm_gain>
// CHECK-NEXT:     k3s.store_rows %y <tensor = out, rows = token_block, index = token, width = 40, accumulate = false>
// CHECK:        k3s.kernel @mlp_prefill_shared_gate_up <grid = "row_block,column_block", num_warps = 4> {
// CHECK-NEXT:     %g, %u = k3s.project <input = x, weight = shared_gate_up, in_dim = 40, out_dim = 24, rows = token_block, input_index = token, layout = stacked_out, glu = true, group = 24>
// CHECK:        k3s.kernel @mlp_prefill_shared_down <grid = "row_block,column_block", num_warps = 4> {
// CHECK-NEXT:     %y = k3s.project <input = shared_act, weight = shared_down, in_dim = 24, out_dim = 40, rows = token_block, input_index = token, layout = stacked_in, glu = false, group = 24>
// CHECK-NEXT:     k3s.store_rows %y <tensor = out, rows = token_block, index = token, width = 40, accumulate = true>
// CHECK:      k3s.entry @moe_decode <source = mlp> {
// CHECK-NOT:    k3s.sort_pairs
// CHECK:        k3s.kernel @mlp_decode_pair_gate_up <grid = "pair,column_block", num_warps = 4> {
// CHECK-NEXT:     %g, %u = k3s.project <input = h, weight = expert_gate_up, in_dim = 16, out_dim = 32, rows = pair, input_index = token, layout = expert, glu = true>
// CHECK:          k3s.store_rows %act <tensor = pair_act, rows = pair, index = pair, width = 32, accumulate = false>
// CHECK:        k3s.kernel @mlp_decode_token_down <grid = "token,column_block", num_warps = 4> {
// CHECK-NEXT:     %y = k3s.project_slots <input = pair_act, weight = expert_down, in_dim = 32, out_dim = 16, top_k = 3>
// CHECK-NEXT:     k3s.store_rows %y <tensor = combined, rows = token, index = token, width = 16, accumulate = false>
// CHECK:      k3s.entry_by_rows @moe <source = mlp, small = moe_decode, large = moe_prefill, small_word = decode, large_word = prefill, max_small_rows = 4>

// ONCE-COUNT-1: k3s.entry @moe_prefill
// ONCE-COUNT-1: k3s.entry_by_rows @moe
// ONCE-NOT: k3s.entry_by_rows @moe

// OPTS: k3s.expert_offsets <num_experts = 12, block_rows = 16>
// OPTS: max_small_rows = 8>

// PLAIN:      k3s.entry @moe_prefill
// PLAIN-NOT:    latent_down <type{{.*}}role = input
// PLAIN:        k3s.tensor_arg @latent_down {{.*}}role = forbidden>
// PLAIN:        k3s.tensor_arg @shared_down {{.*}}role = forbidden>
// PLAIN-NOT:    k3s.kernel @mlp_prefill_latent_down
// PLAIN:        k3s.kernel @mlp_prefill_expert_gate_up
// PLAIN-NEXT:     %g, %u = k3s.project <input = x,
// PLAIN:        k3s.kernel @mlp_prefill_combine
// PLAIN:          k3s.store_rows %c <tensor = out, rows = token_block, index = token, width = 40, accumulate = false>
// PLAIN-NOT:    k3s.kernel @mlp_prefill_shared
// PLAIN:      k3s.entry @moe_decode
// PLAIN:          k3s.store_rows %y <tensor = out, rows = token, index = token, width = 40, accumulate = false>

// BAD: block-rows must be a power of two in 1..256, got 24
