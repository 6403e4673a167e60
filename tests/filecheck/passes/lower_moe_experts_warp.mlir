// lower-moe-experts{decode=warp}: moe_decode split by output neurons. The GLU kernel holds all
// top_k slots of a token as a tile axis (slots: top_k 3 padded to 4) against a block of FFN
// columns, its GLU stored per (token, slot) into pair_act; the down kernel streams the slots'
// rows in teams (warp-slots) reduced in registers and stores the token's combined row: two
// kernels, no per-pair kernel, no combine. moe_prefill is unchanged. On an mxfp4 layer the plan
// reads the words layout: every expert weight of the layer (moe_prefill's too: `moe` passes both
// entries the same tensors) is fp4x8 [E, out, in / 8] with e8m0 scales, and every stage that
// reads one says packing = words (round-trips); warp-block-d below a block of 32 is refused.
// RUN: k3c opt %s -p 'lower-moe-routing,lower-moe-experts{decode=warp warp-slots=2 warp-block-n=8 warp-block-d=64}' | filecheck %s
// RUN: k3c opt %s -p 'lower-moe-routing,lower-moe-experts{decode=warp}' | filecheck %s --check-prefix=DEFAULT
// RUN: sed 's/latent_dim = 16/latent_dim = 32/; s/dtype = bfloat16>/dtype = bfloat16, expert_weight_format = mxfp4>/' %s | k3c opt - -p 'lower-moe-routing,lower-moe-experts{decode=warp}' | k3c opt - | filecheck %s --check-prefix=MXFP4
// RUN: sed 's/latent_dim = 16/latent_dim = 32/; s/dtype = bfloat16>/dtype = bfloat16, expert_weight_format = mxfp4>/' %s | not k3c opt - -p 'lower-moe-routing,lower-moe-experts{decode=warp warp-block-d=16}' 2>&1 | filecheck %s --check-prefix=MXFP4-BD
// RUN: not k3c opt %s -p 'lower-moe-experts{decode=fast}' 2>&1 | filecheck %s --check-prefix=BAD

builtin.module {
  k3.latent_moe @mlp <hidden_size = 40, latent_dim = 16, num_experts = 12, top_k = 3, expert_ffn_dim = 32, num_shared_experts = 1, shared_ffn_dim = 24, activation = situ_glu, norm_topk_prob = true, routed_scaling_factor = 2.5, eps = 1.0e-06, dtype = bfloat16>
}

// CHECK:      k3s.entry @moe_decode <source = @mlp> {
// CHECK:        [[ACT:%pair_act[_0-9]*]] = k3s.tensor_arg @pair_act <role = workspace> : !k3s.tensor<R x 3 x 32, float>
// CHECK-NOT:    k3s.project_slots
// CHECK:        k3s.kernel @mlp_decode_token_gate_up <grid = [token, column_block], num_warps = 4, block_d = 64, block_n = 8> {
// CHECK-NEXT:     %g, %u = k3s.project_token_slots [[H:%h[_0-9]*]], [[IDS:%topk_ids[_0-9]*]], [[EGU:%expert_gate_up[_0-9]*]] <in_dim = 16, out_dim = 32, top_k = 3, slots = 4, glu = true> : !k3s.tile<M x N>, !k3s.tile<M x N>
// CHECK-NEXT:     %act = k3s.glu %g, %u <activation = situ_glu> : !k3s.tile<M x N>
// CHECK-NEXT:     k3s.store_rows %act, [[ACT]] <rows = token_slots, index = pair, width = 32, accumulate = false>
// CHECK-NEXT:   }
// CHECK-NEXT:   k3s.kernel @mlp_decode_token_down <grid = [token, column_block], num_warps = 4, block_d = 64, block_n = 8> {
// CHECK-NEXT:     %y = k3s.sum_expert_rows [[ACT]], [[IDS]], %topk_weights{{[_0-9]*}}, %expert_down{{[_0-9]*}} <in_dim = 32, out_dim = 16, top_k = 3, slots = 2> : !k3s.tile<N>
// CHECK-NEXT:     k3s.store_rows %y, %combined{{[_0-9]*}} <rows = token, index = token, width = 16, accumulate = false>
// CHECK-NEXT:   }
// CHECK-NEXT:   k3s.kernel @mlp_decode_latent_up

// DEFAULT:      k3s.kernel @mlp_decode_token_gate_up <grid = [token, column_block], num_warps = 4, block_d = 128, block_n = 4> {
// DEFAULT:      k3s.sum_expert_rows {{.*}} <in_dim = 32, out_dim = 16, top_k = 3, slots = 4>

// MXFP4:      k3s.entry @moe_prefill <source = @mlp> {
// MXFP4:        k3s.tensor_arg @expert_gate_up_packed <role = input> : !k3s.tensor<12 x 64 x 4, fp4x8>
// MXFP4-NEXT:   k3s.tensor_arg @expert_gate_up_scales <role = input> : !k3s.tensor<12 x 64 x 1, e8m0>
// MXFP4-NEXT:   k3s.tensor_arg @expert_down_packed <role = input> : !k3s.tensor<12 x 32 x 4, fp4x8>
// MXFP4-NEXT:   k3s.tensor_arg @expert_down_scales <role = input> : !k3s.tensor<12 x 32 x 1, e8m0>
// MXFP4:        k3s.project %h{{[_0-9]*}}, %expert_gate_up_packed{{[_0-9]*}}, %expert_gate_up_scales{{.*}} <{{.*}}rows = sorted_block{{.*}}, weight_format = mxfp4, packing = words>
// MXFP4:        k3s.project %expert_act{{[_0-9]*}}, %expert_down_packed{{[_0-9]*}}, %expert_down_scales{{.*}} <{{.*}}, weight_format = mxfp4, packing = words>
// MXFP4:      k3s.entry @moe_decode <source = @mlp> {
// MXFP4:        k3s.tensor_arg @expert_gate_up_packed <role = input> : !k3s.tensor<12 x 64 x 4, fp4x8>
// MXFP4:        %g, %u = k3s.project_token_slots %h{{[_0-9]*}}, %topk_ids{{[_0-9]*}}, %expert_gate_up_packed{{[_0-9]*}}, %expert_gate_up_scales{{[_0-9]*}} <in_dim = 32, out_dim = 32, top_k = 3, slots = 4, glu = true, weight_format = mxfp4, packing = words>
// MXFP4:        %y = k3s.sum_expert_rows %pair_act{{[_0-9]*}}, %topk_ids{{[_0-9]*}}, %topk_weights{{[_0-9]*}}, %expert_down_packed{{[_0-9]*}}, %expert_down_scales{{[_0-9]*}} <in_dim = 32, out_dim = 32, top_k = 3, slots = 4, weight_format = mxfp4, packing = words>

// MXFP4-BD: lower-moe-experts: warp-block-d must hold whole blocks of 32 inputs (a scale each) for @mlp's mxfp4 weights, got 16

// BAD: lower-moe-experts: decode must be split or warp, got fast
