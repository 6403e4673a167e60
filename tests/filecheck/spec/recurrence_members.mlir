// Spec-driven: each recurrence example's kind picks gate and delta rule, and lower-recurrent
// derives that member's stages and interface.
// RUN: k3c ir %examples/gated_deltanet.toml --after-all | filecheck %s --check-prefix=GDN
// RUN: k3c ir %examples/deltanet.toml --after-all | filecheck %s --check-prefix=DN
// RUN: k3c ir %examples/gla.toml --after-all | filecheck %s --check-prefix=GLA

// Gated DeltaNet: scalar gate, delta rule, 16 query/key heads and 32 value heads.
// GDN-LABEL: // -----// IR of spec
// GDN:       k3.recurrence @gated_deltanet <gate = scalar, delta_rule = true, num_heads = 16, num_v_heads = 32, head_k_dim = 128, head_v_dim = 128,
// GDN-LABEL: // -----// IR after lower-recurrent //----- //
// GDN:       %q = k3s.tensor_arg @q <role = input> : !k3s.tensor<B x T x 16 x 128, float>
// GDN:       %v = k3s.tensor_arg @v <role = input> : !k3s.tensor<B x T x 32 x 128, float>
// GDN-NEXT:  %g = k3s.tensor_arg @g <role = input> : !k3s.tensor<B x T x 32, float>
// GDN-NEXT:  %beta = k3s.tensor_arg @beta <role = input> : !k3s.tensor<B x T x 32, float>
// GDN:       %A_log = k3s.tensor_arg @A_log <role = forbidden> : !k3s.tensor<32, float>
// GDN-NEXT:  %dt_bias = k3s.tensor_arg @dt_bias <role = forbidden> : !k3s.tensor<32, float>
// GDN:       %S_final = k3s.token_loop %S, %cu_seqlens {
// GDN-NEXT:  ^bb0(%S_1: !k3s.tile<K x V>):
// GDN-NEXT:    %[[q:[a-z_0-9]+]] = k3s.load_token %q : !k3s.tile<K>
// GDN-NEXT:    %[[k:[a-z_0-9]+]] = k3s.load_token %k : !k3s.tile<K>
// GDN-NEXT:    %[[v:[a-z_0-9]+]] = k3s.load_token %v : !k3s.tile<V>
// GDN-NEXT:    %[[g:[a-z_0-9]+]] = k3s.load_gate %g <gate = scalar, input = log, lower_bound = -5.0, floor = -110.0> : !k3s.tile<>
// GDN-NEXT:    %S_2 = k3s.decay %S_1, %[[g]] <gate = scalar> : !k3s.tile<K x V>
// GDN-NEXT:    %[[beta:[a-z_0-9]+]] = k3s.load_beta %beta <input = probability> : !k3s.tile<>
// GDN-NEXT:    %u = k3s.delta_correct %S_2, %[[k]], %[[v]], %[[beta]] : !k3s.tile<V>
// GDN-NEXT:    %S_3 = k3s.rank1_update %S_2, %[[k]], %u : !k3s.tile<K x V>
// GDN-NEXT:    %{{[a-z_0-9]+}} = k3s.readout %S_3, %[[q]], %o, %scale : !k3s.tile<V>
// GDN-NEXT:    k3s.next_token %S_3
// GDN-NEXT:  } : !k3s.tile<K x V>

// DeltaNet: no gate (no gate load or decay stage; g, A_log and dt_bias forbidden), delta rule
// (beta input, loaded before the delta correction).
// DN-LABEL: // -----// IR of spec
// DN:       k3.recurrence @deltanet <gate = none, delta_rule = true,
// DN-LABEL: // -----// IR after lower-recurrent //----- //
// DN:       %g = k3s.tensor_arg @g <role = forbidden> : !k3s.tensor<B x T x 16, float>
// DN-NEXT:  %beta = k3s.tensor_arg @beta <role = input> : !k3s.tensor<B x T x 16, float>
// DN:       %A_log = k3s.tensor_arg @A_log <role = forbidden> : !k3s.tensor<16, float>
// DN-NEXT:  %dt_bias = k3s.tensor_arg @dt_bias <role = forbidden> : !k3s.tensor<16, float>
// DN-NOT:   k3s.load_gate
// DN-NOT:   k3s.decay
// DN:       %S_final = k3s.token_loop %S, %cu_seqlens {
// DN-NEXT:  ^bb0(%S_1: !k3s.tile<K x V>):
// DN-NEXT:    %[[q:[a-z_0-9]+]] = k3s.load_token %q : !k3s.tile<K>
// DN-NEXT:    %[[k:[a-z_0-9]+]] = k3s.load_token %k : !k3s.tile<K>
// DN-NEXT:    %[[v:[a-z_0-9]+]] = k3s.load_token %v : !k3s.tile<V>
// DN-NEXT:    %[[beta:[a-z_0-9]+]] = k3s.load_beta %beta <input = probability> : !k3s.tile<>
// DN-NEXT:    %u = k3s.delta_correct %S_1, %[[k]], %[[v]], %[[beta]] : !k3s.tile<V>
// DN-NEXT:    %S_2 = k3s.rank1_update %S_1, %[[k]], %u : !k3s.tile<K x V>
// DN-NEXT:    %{{[a-z_0-9]+}} = k3s.readout %S_2, %[[q]], %o, %scale : !k3s.tile<V>
// DN-NEXT:    k3s.next_token %S_2
// DN-NEXT:  } : !k3s.tile<K x V>
// DN-NOT:   k3s.load_gate
// DN-NOT:   k3s.decay

// Gated linear attention: channel gate, no delta rule (beta forbidden, no load_beta or
// delta_correct), vk state.
// GLA-LABEL: // -----// IR of spec
// GLA:       k3.recurrence @gla <gate = channel, delta_rule = false, {{.*}} state_layout = vk,
// GLA-LABEL: // -----// IR after lower-recurrent //----- //
// GLA:       %g = k3s.tensor_arg @g <role = input> : !k3s.tensor<B x T x 16 x 128, float>
// GLA-NEXT:  %beta = k3s.tensor_arg @beta <role = forbidden> : !k3s.tensor<B x T x 16, float>
// GLA:       %A_log = k3s.tensor_arg @A_log <role = forbidden> : !k3s.tensor<16, float>
// GLA-NEXT:  %dt_bias = k3s.tensor_arg @dt_bias <role = forbidden> : !k3s.tensor<2048, float>
// GLA-NOT:   k3s.load_beta
// GLA-NOT:   k3s.delta_correct
// GLA:       %S = k3s.state_tile %initial_state <head_k_dim = 128, head_v_dim = 128, block_v = 32, layout = vk> : !k3s.tile<K x V>
// GLA-NEXT:  %S_final = k3s.token_loop %S, %cu_seqlens {
// GLA-NEXT:  ^bb0(%S_1: !k3s.tile<K x V>):
// GLA-NEXT:    %[[q:[a-z_0-9]+]] = k3s.load_token %q : !k3s.tile<K>
// GLA-NEXT:    %[[k:[a-z_0-9]+]] = k3s.load_token %k : !k3s.tile<K>
// GLA-NEXT:    %[[v:[a-z_0-9]+]] = k3s.load_token %v : !k3s.tile<V>
// GLA-NEXT:    %[[g:[a-z_0-9]+]] = k3s.load_gate %g <gate = channel, input = log, lower_bound = -5.0, floor = -110.0> : !k3s.tile<K>
// GLA-NEXT:    %S_2 = k3s.decay %S_1, %[[g]] <gate = channel> : !k3s.tile<K x V>
// GLA-NEXT:    %S_3 = k3s.rank1_update %S_2, %[[k]], %[[v]] : !k3s.tile<K x V>
// GLA-NEXT:    %{{[a-z_0-9]+}} = k3s.readout %S_3, %[[q]], %o, %scale : !k3s.tile<V>
// GLA-NEXT:    k3s.next_token %S_3
// GLA-NEXT:  } : !k3s.tile<K x V>
// GLA-NEXT:  k3s.store_state %S_final, %final_state <layout = vk>
// GLA-NOT:   k3s.load_beta
// GLA-NOT:   k3s.delta_correct
