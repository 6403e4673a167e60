// lower-moe-experts on a layer with expert_weight_format = mxfp4: each routed-expert weight is an
// entry argument pair, its packed values (fp4x2: two E2M1 codes a byte, [E, out, in / 2]) and
// its scales (e8m0: one per 32 inputs, [E, out, in / 32]), in the place of the bf16 weight; the
// four projections that read them say weight_format = mxfp4 and take the scales after the
// packed values. The latent and
// shared experts' weights stay in the layer's dtype. The property round-trips (k3c opt). The
// weights are laid out for one decode plan, so the dispatch table runs that one only (default:
// the decode option's up to 4 tokens); a table naming the other, or a warp bucket's BD below a
// block of 32, is refused in one line.
// RUN: k3c opt %s -p lower-moe-routing,lower-moe-experts | filecheck %s
// RUN: k3c opt %s -p lower-moe-routing,lower-moe-experts | k3c opt - | filecheck %s
// RUN: k3c opt %s | filecheck %s --check-prefix=LAYER
// RUN: not k3c opt %s -p 'lower-moe-routing,lower-moe-experts{dispatch="1=split,4=warp"}' 2>&1 | filecheck %s --check-prefix=OTHER-PLAN
// RUN: not k3c opt %s -p 'lower-moe-routing,lower-moe-experts{decode=warp dispatch="4=warp/4x16"}' 2>&1 | filecheck %s --check-prefix=WARP-BD

builtin.module {
  k3.latent_moe @mlp <hidden_size = 40, latent_dim = 32, num_experts = 12, top_k = 3, expert_ffn_dim = 64, num_shared_experts = 1, shared_ffn_dim = 24, activation = situ_glu, norm_topk_prob = true, routed_scaling_factor = 2.5, eps = 1.0e-06, dtype = bfloat16, expert_weight_format = mxfp4>
}

// LAYER: k3.latent_moe @mlp <{{.*}}, dtype = bfloat16, expert_weight_format = mxfp4>

// OTHER-PLAN: {{^}}k3c opt: error: {{.*}}lower-moe-experts: dispatch: bucket '4=warp': @mlp's mxfp4 weights are laid out for decode = split only (pass decode=warp to run that plan){{$}}
// WARP-BD: {{^}}k3c opt: error: {{.*}}lower-moe-experts: dispatch: a warp bucket's BD must hold whole blocks of 32 inputs (a scale each) for @mlp's mxfp4 weights, got '4=warp/4x16'{{$}}

// CHECK:      k3s.entry @moe_prefill <source = @mlp> {
// CHECK-NEXT:   [[X:%x[_0-9]*]] = k3s.tensor_arg @x <role = input> : !k3s.tensor<R x 40, float>
// CHECK-NEXT:   k3s.tensor_arg @router_weight
// CHECK-NEXT:   k3s.tensor_arg @router_bias
// CHECK-NEXT:   [[GU_PACKED:%expert_gate_up_packed[_0-9]*]] = k3s.tensor_arg @expert_gate_up_packed <role = input> : !k3s.tensor<12 x 128 x 16, fp4x2>
// CHECK-NEXT:   [[GU_SCALES:%expert_gate_up_scales[_0-9]*]] = k3s.tensor_arg @expert_gate_up_scales <role = input> : !k3s.tensor<12 x 128 x 1, e8m0>
// CHECK-NEXT:   [[D_PACKED:%expert_down_packed[_0-9]*]] = k3s.tensor_arg @expert_down_packed <role = input> : !k3s.tensor<12 x 32 x 32, fp4x2>
// CHECK-NEXT:   [[D_SCALES:%expert_down_scales[_0-9]*]] = k3s.tensor_arg @expert_down_scales <role = input> : !k3s.tensor<12 x 32 x 2, e8m0>
// CHECK-NEXT:   [[LD:%latent_down[_0-9]*]] = k3s.tensor_arg @latent_down <role = input> : !k3s.tensor<32 x 40, float>
// CHECK-NEXT:   [[LU:%latent_up[_0-9]*]] = k3s.tensor_arg @latent_up <role = input>
// CHECK-NEXT:   [[GAIN:%latent_norm_gain[_0-9]*]] = k3s.tensor_arg @latent_norm_gain <role = input>
// CHECK-NEXT:   [[SGU:%shared_gate_up[_0-9]*]] = k3s.tensor_arg @shared_gate_up <role = input>
// CHECK:        [[H:%h[_0-9]*]] = k3s.tensor_arg @h <role = workspace>
// CHECK:        [[OFFSETS:%expert_offsets[_0-9]*]] = k3s.tensor_arg @expert_offsets <role = workspace>
// CHECK-NEXT:   [[SORTED:%sorted_pairs[_0-9]*]] = k3s.tensor_arg @sorted_pairs <role = workspace, fill = -1>
// CHECK-NEXT:   [[BLOCKS:%block_expert[_0-9]*]] = k3s.tensor_arg @block_expert <role = workspace>
// CHECK-NEXT:   [[ACT:%expert_act[_0-9]*]] = k3s.tensor_arg @expert_act <role = workspace>
// CHECK:        [[COMBINED:%combined[_0-9]*]] = k3s.tensor_arg @combined <role = workspace>
// CHECK:        = k3s.project [[X]], [[LD]] <in_dim = 40, out_dim = 32, rows = token_block, input_index = token, layout = dense, glu = false>
// CHECK:        = k3s.project [[H]], [[GU_PACKED]], [[GU_SCALES]], [[OFFSETS]], [[SORTED]], [[BLOCKS]] <in_dim = 32, out_dim = 64, rows = sorted_block, input_index = token, layout = expert, glu = true, block_rows = 128, weight_format = mxfp4>
// CHECK:        = k3s.project [[ACT]], [[D_PACKED]], [[D_SCALES]], [[OFFSETS]], [[SORTED]], [[BLOCKS]] <in_dim = 64, out_dim = 32, rows = sorted_block, input_index = position, layout = expert, glu = false, block_rows = 128, weight_format = mxfp4>
// CHECK:        = k3s.project [[COMBINED]], [[LU]], [[GAIN]] <in_dim = 32, out_dim = 40, rows = token_block, input_index = token, layout = dense, glu = false, rms_eps = 1.0e-06>
// CHECK:        = k3s.project [[X]], [[SGU]] <in_dim = 40, out_dim = 24, rows = token_block, input_index = token, layout = stacked_out, glu = true, group = 24>
// CHECK:      k3s.entry @moe_decode <source = @mlp> {
// CHECK:        [[GU_PACKED:%expert_gate_up_packed[_0-9]*]] = k3s.tensor_arg @expert_gate_up_packed <role = input> : !k3s.tensor<12 x 128 x 16, fp4x2>
// CHECK-NEXT:   [[GU_SCALES:%expert_gate_up_scales[_0-9]*]] = k3s.tensor_arg @expert_gate_up_scales <role = input>
// CHECK-NEXT:   [[D_PACKED:%expert_down_packed[_0-9]*]] = k3s.tensor_arg @expert_down_packed <role = input>
// CHECK-NEXT:   [[D_SCALES:%expert_down_scales[_0-9]*]] = k3s.tensor_arg @expert_down_scales <role = input>
// CHECK:        [[IDS:%topk_ids[_0-9]*]] = k3s.tensor_arg @topk_ids <role = workspace>
// CHECK-NEXT:   [[TW:%topk_weights[_0-9]*]] = k3s.tensor_arg @topk_weights <role = workspace>
// CHECK:        [[H:%h[_0-9]*]] = k3s.tensor_arg @h <role = workspace>
// CHECK-NEXT:   [[PAIR_ACT:%pair_act[_0-9]*]] = k3s.tensor_arg @pair_act <role = workspace>
// CHECK:        = k3s.project [[H]], [[GU_PACKED]], [[GU_SCALES]], [[IDS]] <in_dim = 32, out_dim = 64, rows = pair, input_index = token, layout = expert, glu = true, weight_format = mxfp4>
// CHECK:        = k3s.project_slots [[PAIR_ACT]], [[IDS]], [[TW]], [[D_PACKED]], [[D_SCALES]] <in_dim = 64, out_dim = 32, top_k = 3, weight_format = mxfp4>
