// lower-moe-experts: after the route entry, moe_prefill (expert-centric), moe_decode
// (token-centric, split), moe_decode_warp (the default dispatch table runs it) and moe (the
// table's choice by row count). The stages follow from the layer op:
// latent_dim > 0 brings the latent down-projection before the experts and the RMS-normalised
// up-projection after them; shared experts bring one dense GLU over all of them (stacked
// layouts) whose down projection adds to out; latent_dim = 0 and no shared experts leave the
// routed experts alone, writing out directly. The routing kernels (lower-moe-routing's) are
// renamed per entry. Every stage takes the tensors it reads or writes as operands: its entry's
// arguments (the projections of a sorted block also the dispatch plan their rows come from,
// those of a pair its topk_ids).
// RUN: k3c opt %s -p lower-moe-routing,lower-moe-experts | filecheck %s
// RUN: k3c opt %s -p lower-moe-routing,lower-moe-experts | k3c opt - | filecheck %s
// RUN: k3c opt %s -p lower-moe-routing,lower-moe-experts,lower-moe-experts | filecheck %s --check-prefix=ONCE
// RUN: k3c opt %s -p 'lower-moe-routing,lower-moe-experts{block-rows=16 dispatch="8=split"}' | filecheck %s --check-prefix=OPTS
// RUN: sed 's/latent_dim = 16/latent_dim = 0/; s/num_shared_experts = 1/num_shared_experts = 0/' %s | k3c opt - -p lower-moe-routing,lower-moe-experts | filecheck %s --check-prefix=PLAIN
// RUN: not k3c opt %s -p 'lower-moe-experts{block-rows=24}' 2>&1 | filecheck %s --check-prefix=BAD

builtin.module {
  k3.latent_moe @mlp <hidden_size = 40, latent_dim = 16, num_experts = 12, top_k = 3, expert_ffn_dim = 32, num_shared_experts = 1, shared_ffn_dim = 24, activation = situ_glu, norm_topk_prob = true, routed_scaling_factor = 2.5, eps = 1.0e-06, dtype = bfloat16>
}

// CHECK:      k3s.entry @moe_prefill <source = @mlp> {
// CHECK-NEXT:   [[X:%x[_0-9]*]] = k3s.tensor_arg @x <role = input> : !k3s.tensor<R x 40, float>
// CHECK-NEXT:   [[RW:%router_weight[_0-9]*]] = k3s.tensor_arg @router_weight <role = input> : !k3s.tensor<12 x 40, float>
// CHECK-NEXT:   [[RB:%router_bias[_0-9]*]] = k3s.tensor_arg @router_bias <role = input> : !k3s.tensor<12, float32>
// CHECK-NEXT:   [[EGU:%expert_gate_up[_0-9]*]] = k3s.tensor_arg @expert_gate_up <role = input> : !k3s.tensor<12 x 64 x 16, float>
// CHECK-NEXT:   [[ED:%expert_down[_0-9]*]] = k3s.tensor_arg @expert_down <role = input> : !k3s.tensor<12 x 16 x 32, float>
// CHECK-NEXT:   [[LD:%latent_down[_0-9]*]] = k3s.tensor_arg @latent_down <role = input> : !k3s.tensor<16 x 40, float>
// CHECK-NEXT:   [[LU:%latent_up[_0-9]*]] = k3s.tensor_arg @latent_up <role = input> : !k3s.tensor<40 x 16, float>
// CHECK-NEXT:   [[GAIN:%latent_norm_gain[_0-9]*]] = k3s.tensor_arg @latent_norm_gain <role = input> : !k3s.tensor<16, float>
// CHECK-NEXT:   [[SGU:%shared_gate_up[_0-9]*]] = k3s.tensor_arg @shared_gate_up <role = input> : !k3s.tensor<1 x 48 x 40, float>
// CHECK-NEXT:   [[SD:%shared_down[_0-9]*]] = k3s.tensor_arg @shared_down <role = input> : !k3s.tensor<1 x 40 x 24, float>
// CHECK-NEXT:   [[OUT:%out[_0-9]*]] = k3s.tensor_arg @out <role = output> : !k3s.tensor<R x 40, float>
// CHECK-NEXT:   [[IDS:%topk_ids[_0-9]*]] = k3s.tensor_arg @topk_ids <role = workspace> : !k3s.tensor<R x 3, index>
// CHECK-NEXT:   [[TW:%topk_weights[_0-9]*]] = k3s.tensor_arg @topk_weights <role = workspace> : !k3s.tensor<R x 3, float32>
// CHECK-NEXT:   [[PL:%partial_logits[_0-9]*]] = k3s.tensor_arg @partial_logits <role = workspace> : !k3s.tensor<HS x R x 12, float32>
// CHECK-NEXT:   [[H:%h[_0-9]*]] = k3s.tensor_arg @h <role = workspace> : !k3s.tensor<R x 16, float>
// CHECK-NEXT:   [[COUNTS:%expert_counts[_0-9]*]] = k3s.tensor_arg @expert_counts <role = workspace, fill = 0> : !k3s.tensor<12, index>
// CHECK-NEXT:   [[RANK:%pair_rank[_0-9]*]] = k3s.tensor_arg @pair_rank <role = workspace> : !k3s.tensor<R x 3, index>
// CHECK-NEXT:   [[OFFSETS:%expert_offsets[_0-9]*]] = k3s.tensor_arg @expert_offsets <role = workspace> : !k3s.tensor<13, index>
// CHECK-NEXT:   [[SORTED:%sorted_pairs[_0-9]*]] = k3s.tensor_arg @sorted_pairs <role = workspace, fill = -1> : !k3s.tensor<PP, index>
// CHECK-NEXT:   [[BLOCKS:%block_expert[_0-9]*]] = k3s.tensor_arg @block_expert <role = workspace> : !k3s.tensor<PB, index>
// CHECK-NEXT:   [[ACT:%expert_act[_0-9]*]] = k3s.tensor_arg @expert_act <role = workspace> : !k3s.tensor<PP x 32, float>
// CHECK-NEXT:   [[PAIR_OUT:%pair_out[_0-9]*]] = k3s.tensor_arg @pair_out <role = workspace> : !k3s.tensor<R x 3 x 16, float>
// CHECK-NEXT:   [[COMBINED:%combined[_0-9]*]] = k3s.tensor_arg @combined <role = workspace> : !k3s.tensor<R x 16, float32>
// CHECK-NEXT:   [[SHARED_ACT:%shared_act[_0-9]*]] = k3s.tensor_arg @shared_act <role = workspace> : !k3s.tensor<R x 24, float>
// CHECK-NEXT:   k3s.kernel @mlp_prefill_router_logits <grid = [expert_block, row_block, hidden_slice], num_warps = 8> {
// CHECK-NEXT:     [[LOGITS:%logits[_0-9]*]] = k3s.router_logits [[X]], [[RW]] <hidden_size = 40, num_experts = 12>
// CHECK-NEXT:     k3s.store_partial_logits [[LOGITS]], [[PL]]
// CHECK:        k3s.kernel @mlp_prefill_router_top_k <grid = [row_block], num_warps = 8> {
// CHECK-NEXT:     k3s.sum_partial_logits [[PL]] <num_experts = 12>
// CHECK-NEXT:     router_sigmoid
// CHECK-NEXT:     k3s.select_top_k {{%s[_0-9]*}}, [[RB]] <top_k = 3>
// CHECK-NEXT:     [[WEIGHTS:%weights[_0-9]*]] = k3s.routing_weights
// CHECK-NEXT:     k3s.store_routing {{%ids[_0-9]*}}, [[WEIGHTS]], [[IDS]], [[TW]]
// CHECK:        k3s.kernel @mlp_prefill_latent_down <grid = [row_block, column_block], num_warps = 4> {
// CHECK-NEXT:     [[Y:%y[_0-9]*]] = k3s.project [[X]], [[LD]] <in_dim = 40, out_dim = 16, rows = token_block, input_index = token, layout = dense, glu = false>
// CHECK-NEXT:     k3s.store_rows [[Y]], [[H]] <rows = token_block, index = token, width = 16, accumulate = false>
// CHECK:        k3s.kernel @mlp_prefill_count_pairs <grid = [pair_chunk], num_warps = 4> {
// CHECK-NEXT:     k3s.count_pairs [[IDS]], [[COUNTS]], [[RANK]] <num_experts = 12, top_k = 3>
// CHECK:        k3s.kernel @mlp_prefill_expert_offsets <grid = [one], num_warps = 4> {
// CHECK-NEXT:     k3s.expert_offsets [[COUNTS]], [[OFFSETS]] <num_experts = 12, block_rows = 128>
// CHECK:        k3s.kernel @mlp_prefill_sort_pairs <grid = [pair_chunk], num_warps = 4> {
// CHECK-NEXT:     k3s.sort_pairs [[IDS]], [[OFFSETS]], [[RANK]], [[SORTED]], [[BLOCKS]] <top_k = 3, block_rows = 128>
// CHECK:        k3s.kernel @mlp_prefill_expert_gate_up <grid = [sorted_block, column_block], num_warps = 4> {
// CHECK-NEXT:     [[G:%g[_0-9]*]], [[U:%u[_0-9]*]] = k3s.project [[H]], [[EGU]], [[OFFSETS]], [[SORTED]], [[BLOCKS]] <in_dim = 16, out_dim = 32, rows = sorted_block, input_index = token, layout = expert, glu = true, block_rows = 128>
// CHECK-NEXT:     [[A:%act[_0-9]*]] = k3s.glu [[G]], [[U]] <activation = situ_glu>
// CHECK-NEXT:     k3s.store_rows [[A]], [[ACT]] <rows = sorted_block, index = position, width = 32, accumulate = false>
// CHECK:        k3s.kernel @mlp_prefill_expert_down <grid = [sorted_block, column_block], num_warps = 4> {
// CHECK-NEXT:     [[Y:%y[_0-9]*]] = k3s.project [[ACT]], [[ED]], [[OFFSETS]], [[SORTED]], [[BLOCKS]] <in_dim = 32, out_dim = 16, rows = sorted_block, input_index = position, layout = expert, glu = false, block_rows = 128>
// CHECK-NEXT:     [[YW:%yw[_0-9]*]] = k3s.weigh_pairs [[Y]], [[TW]]
// CHECK-NEXT:     k3s.store_rows [[YW]], [[PAIR_OUT]] <rows = sorted_block, index = pair, width = 16, accumulate = false>
// CHECK:        k3s.kernel @mlp_prefill_combine <grid = [row_block, column_block], num_warps = 4> {
// CHECK-NEXT:     [[C:%c[_0-9]*]] = k3s.sum_slots [[PAIR_OUT]] <out_dim = 16, top_k = 3>
// CHECK-NEXT:     k3s.store_rows [[C]], [[COMBINED]] <rows = token_block, index = token, width = 16, accumulate = false>
// CHECK:        k3s.kernel @mlp_prefill_latent_up <grid = [row_block, column_block], num_warps = 4> {
// CHECK-NEXT:     [[Y:%y[_0-9]*]] = k3s.project [[COMBINED]], [[LU]], [[GAIN]] <in_dim = 16, out_dim = 40, rows = token_block, input_index = token, layout = dense, glu = false, rms_eps = 1.0e-06>
// CHECK-NEXT:     k3s.store_rows [[Y]], [[OUT]] <rows = token_block, index = token, width = 40, accumulate = false>
// CHECK:        k3s.kernel @mlp_prefill_shared_gate_up <grid = [row_block, column_block], num_warps = 4> {
// CHECK-NEXT:     = k3s.project [[X]], [[SGU]] <in_dim = 40, out_dim = 24, rows = token_block, input_index = token, layout = stacked_out, glu = true, group = 24>
// CHECK-NEXT:     [[A:%act[_0-9]*]] = k3s.glu
// CHECK-NEXT:     k3s.store_rows [[A]], [[SHARED_ACT]] <rows = token_block, index = token, width = 24, accumulate = false>
// CHECK:        k3s.kernel @mlp_prefill_shared_down <grid = [row_block, column_block], num_warps = 4> {
// CHECK-NEXT:     [[Y:%y[_0-9]*]] = k3s.project [[SHARED_ACT]], [[SD]] <in_dim = 24, out_dim = 40, rows = token_block, input_index = token, layout = stacked_in, glu = false, group = 24>
// CHECK-NEXT:     k3s.store_rows [[Y]], [[OUT]] <rows = token_block, index = token, width = 40, accumulate = true>
// CHECK:      k3s.entry @moe_decode <source = @mlp> {
// CHECK-NEXT:   [[X:%x[_0-9]*]] = k3s.tensor_arg @x <role = input>
// CHECK:        [[EGU:%expert_gate_up[_0-9]*]] = k3s.tensor_arg @expert_gate_up <role = input>
// CHECK-NEXT:   [[ED:%expert_down[_0-9]*]] = k3s.tensor_arg @expert_down <role = input>
// CHECK:        [[IDS:%topk_ids[_0-9]*]] = k3s.tensor_arg @topk_ids <role = workspace>
// CHECK-NEXT:   [[TW:%topk_weights[_0-9]*]] = k3s.tensor_arg @topk_weights <role = workspace>
// CHECK:        [[H:%h[_0-9]*]] = k3s.tensor_arg @h <role = workspace>
// CHECK-NEXT:   [[PAIR_ACT:%pair_act[_0-9]*]] = k3s.tensor_arg @pair_act <role = workspace> : !k3s.tensor<R x 3 x 32, float>
// CHECK-NEXT:   [[COMBINED:%combined[_0-9]*]] = k3s.tensor_arg @combined <role = workspace>
// CHECK-NOT:    k3s.sort_pairs
// CHECK:        k3s.kernel @mlp_decode_pair_gate_up <grid = [pair, column_block], num_warps = 4> {
// CHECK-NEXT:     = k3s.project [[H]], [[EGU]], [[IDS]] <in_dim = 16, out_dim = 32, rows = pair, input_index = token, layout = expert, glu = true>
// CHECK:          k3s.store_rows {{%act[_0-9]*}}, [[PAIR_ACT]] <rows = pair, index = pair, width = 32, accumulate = false>
// CHECK:        k3s.kernel @mlp_decode_token_down <grid = [token, column_block], num_warps = 4> {
// CHECK-NEXT:     [[Y:%y[_0-9]*]] = k3s.project_slots [[PAIR_ACT]], [[IDS]], [[TW]], [[ED]] <in_dim = 32, out_dim = 16, top_k = 3>
// CHECK-NEXT:     k3s.store_rows [[Y]], [[COMBINED]] <rows = token, index = token, width = 16, accumulate = false>
// CHECK:      k3s.entry @moe_decode_warp <source = @mlp> {
// CHECK:        k3s.kernel @mlp_decode_warp_token_gate_up
// CHECK:      k3s.entry_by_rows @moe <source = @mlp, entries = [@moe_decode, @moe_decode_warp, @moe_prefill], words = [decode, decode_warp, prefill], max_rows = [1, 4], by_rows = [@moe_decode, @moe_decode_warp, @moe_prefill]>

// ONCE-COUNT-1: k3s.entry @moe_prefill
// ONCE-COUNT-1: k3s.entry_by_rows @moe
// ONCE-NOT: k3s.entry_by_rows @moe

// OPTS: k3s.expert_offsets {{%expert_counts[_0-9]*}}, {{%expert_offsets[_0-9]*}} <num_experts = 12, block_rows = 16>
// OPTS-NOT: k3s.entry @moe_decode_warp
// OPTS: k3s.entry_by_rows @moe <source = @mlp, entries = [@moe_decode, @moe_prefill], words = [decode, prefill], max_rows = [8], by_rows = [@moe_decode, @moe_prefill]>

// PLAIN:      k3s.entry @moe_prefill
// PLAIN-NEXT:   [[X:%x[_0-9]*]] = k3s.tensor_arg @x <role = input>
// PLAIN-NOT:    k3s.tensor_arg @latent_down <role = input>
// PLAIN:        k3s.tensor_arg @latent_down <role = forbidden>
// PLAIN:        k3s.tensor_arg @shared_down <role = forbidden>
// PLAIN-NEXT:   [[OUT:%out[_0-9]*]] = k3s.tensor_arg @out <role = output>
// PLAIN-NOT:    k3s.kernel @mlp_prefill_latent_down
// PLAIN:        k3s.kernel @mlp_prefill_expert_gate_up
// PLAIN-NEXT:     %g, %u = k3s.project [[X]], {{%expert_gate_up[_0-9]*}},
// PLAIN:        k3s.kernel @mlp_prefill_combine
// PLAIN:          k3s.store_rows %c, [[OUT]] <rows = token_block, index = token, width = 40, accumulate = false>
// PLAIN-NOT:    k3s.kernel @mlp_prefill_shared
// PLAIN:      k3s.entry @moe_decode
// PLAIN:        [[OUT:%out[_0-9]*]] = k3s.tensor_arg @out <role = output>
// PLAIN:          k3s.store_rows {{%y[_0-9]*}}, [[OUT]] <rows = token, index = token, width = 40, accumulate = false>

// BAD: block-rows must be a power of two in 1..256, got 24
