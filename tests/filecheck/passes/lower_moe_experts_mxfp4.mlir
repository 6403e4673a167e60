// lower-moe-experts on a layer with expert_weight_format = mxfp4: each routed-expert weight is an
// entry argument pair, its packed values (fp4x2: two E2M1 codes a byte, [E, out, in / 2]) and
// its scales (e8m0: one per 32 inputs, [E, out, in / 32]), in the place of the bf16 weight; the
// four projections that read them say weight_format = mxfp4 and name the scales. The latent and
// shared experts' weights stay in the layer's dtype. The property round-trips (k3c opt).
// RUN: k3c opt %s -p lower-moe-routing,lower-moe-experts | filecheck %s
// RUN: k3c opt %s -p lower-moe-routing,lower-moe-experts | k3c opt - | filecheck %s
// RUN: k3c opt %s | filecheck %s --check-prefix=LAYER

builtin.module {
  k3.latent_moe @mlp <hidden_size = 40, latent_dim = 32, num_experts = 12, top_k = 3, expert_ffn_dim = 64, num_shared_experts = 1, shared_ffn_dim = 24, activation = situ_glu, norm_topk_prob = true, routed_scaling_factor = 2.5, eps = 1.0e-06, dtype = bfloat16, expert_weight_format = mxfp4>
}

// LAYER: k3.latent_moe @mlp <{{.*}}, dtype = bfloat16, expert_weight_format = mxfp4>

// CHECK:      k3s.entry @moe_prefill <source = mlp> {
// CHECK-NEXT:   %x = k3s.tensor_arg @x <role = input> : !k3s.tensor<R x 40, float>
// CHECK-NEXT:   k3s.tensor_arg @router_weight
// CHECK-NEXT:   k3s.tensor_arg @router_bias
// CHECK-NEXT:   %expert_gate_up_packed = k3s.tensor_arg @expert_gate_up_packed <role = input> : !k3s.tensor<12 x 128 x 16, fp4x2>
// CHECK-NEXT:   %expert_gate_up_scales = k3s.tensor_arg @expert_gate_up_scales <role = input> : !k3s.tensor<12 x 128 x 1, e8m0>
// CHECK-NEXT:   %expert_down_packed = k3s.tensor_arg @expert_down_packed <role = input> : !k3s.tensor<12 x 32 x 32, fp4x2>
// CHECK-NEXT:   %expert_down_scales = k3s.tensor_arg @expert_down_scales <role = input> : !k3s.tensor<12 x 32 x 2, e8m0>
// CHECK-NEXT:   %latent_down = k3s.tensor_arg @latent_down <role = input> : !k3s.tensor<32 x 40, float>
// CHECK:        %y = k3s.project <input = x, weight = latent_down, in_dim = 40, out_dim = 32, rows = token_block, input_index = token, layout = dense, glu = false>
// CHECK:        %g, %u = k3s.project <input = h, weight = expert_gate_up_packed, in_dim = 32, out_dim = 64, rows = sorted_block, input_index = token, layout = expert, glu = true, block_rows = 128, weight_format = mxfp4, scales = expert_gate_up_scales>
// CHECK:        %y = k3s.project <input = expert_act, weight = expert_down_packed, in_dim = 64, out_dim = 32, rows = sorted_block, input_index = position, layout = expert, glu = false, block_rows = 128, weight_format = mxfp4, scales = expert_down_scales>
// CHECK:        %y = k3s.project <input = combined, weight = latent_up, in_dim = 32, out_dim = 40, rows = token_block, input_index = token, layout = dense, glu = false, rms_eps = 1.0e-06, gain = latent_norm_gain>
// CHECK:        %g, %u = k3s.project <input = x, weight = shared_gate_up, in_dim = 40, out_dim = 24, rows = token_block, input_index = token, layout = stacked_out, glu = true, group = 24>
// CHECK:      k3s.entry @moe_decode <source = mlp> {
// CHECK:        %expert_gate_up_packed = k3s.tensor_arg @expert_gate_up_packed <role = input> : !k3s.tensor<12 x 128 x 16, fp4x2>
// CHECK:        %g, %u = k3s.project <input = h, weight = expert_gate_up_packed, in_dim = 32, out_dim = 64, rows = pair, input_index = token, layout = expert, glu = true, weight_format = mxfp4, scales = expert_gate_up_scales>
// CHECK:        %y = k3s.project_slots <input = pair_act, weight = expert_down_packed, in_dim = 64, out_dim = 32, top_k = 3, weight_format = mxfp4, scales = expert_down_scales>
