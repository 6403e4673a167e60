// lower-recurrent on Gated DeltaNet (scalar gate) with an in-kernel gate: A_log and dt_bias are
// per value head ([HV] each: one bias per head, not per key channel), and load_gate carries the
// scalar gate, its input form and the bounded form's lower bound.
// RUN: k3c opt %s -p lower-recurrent | filecheck %s
// RUN: k3c opt %s -p lower-recurrent | k3c opt - | filecheck %s
// softplus: the lower bound is not written, so load_gate carries the default -5.0.
// RUN: sed 's/gate_input = bounded, gate_lower_bound = -3.0/gate_input = softplus/' %s | k3c opt - -p lower-recurrent | filecheck %s --check-prefix=SOFTPLUS
// The chunk entry: the same parameters, the same gate load in both kernels.
// RUN: k3c opt %s -p 'lower-recurrent,derive-chunkwise{chunk-size=16},fuse-chunkwise{block-v=16}' | filecheck %s --check-prefix=CHUNK
// GLA (channel gate, no delta rule) with a softplus gate: dt_bias is per key channel [HV * K],
// beta stays forbidden and there is no beta load.
// RUN: sed 's/gate = scalar, delta_rule = true/gate = channel, delta_rule = false/; s/gate_input = bounded, gate_lower_bound = -3.0/gate_input = softplus/' %s | k3c opt - -p lower-recurrent | filecheck %s --check-prefix=GLA

builtin.module {
  k3.recurrence @gdn <gate = scalar, delta_rule = true, num_heads = 2, num_v_heads = 4, head_k_dim = 24, head_v_dim = 40, scale = 0.25, state_layout = vk, dtype = float32, gate_input = bounded, gate_lower_bound = -3.0>
}

// CHECK:      k3.recurrence @gdn <{{.*}}, dtype = float32, gate_input = bounded, gate_lower_bound = -3.0>
// CHECK-NEXT: k3s.entry @recurrent <source = @gdn> {
// CHECK:        %g = k3s.tensor_arg @g <role = input> : !k3s.tensor<B x T x 4, float>
// CHECK-NEXT:   %beta = k3s.tensor_arg @beta <role = input> : !k3s.tensor<B x T x 4, float>
// CHECK:        %cu_seqlens = k3s.tensor_arg @cu_seqlens <role = optional_input, purpose = sequence_offsets> : !k3s.tensor<N+1, offsets>
// CHECK-NEXT:   %A_log = k3s.tensor_arg @A_log <role = input> : !k3s.tensor<4, float>
// CHECK-NEXT:   %dt_bias = k3s.tensor_arg @dt_bias <role = input> : !k3s.tensor<4, float>
// CHECK-NEXT:   k3s.kernel @gdn_recurrent
// CHECK:        %S_final = k3s.token_loop %S, %cu_seqlens {
// CHECK-NEXT:   ^bb0(%S_1: !k3s.tile<K x V>):
// CHECK-NEXT:     %[[q:[a-z_0-9]+]] = k3s.load_token %q : !k3s.tile<K>
// CHECK-NEXT:     %[[k:[a-z_0-9]+]] = k3s.load_token %k : !k3s.tile<K>
// CHECK-NEXT:     %[[v:[a-z_0-9]+]] = k3s.load_token %v : !k3s.tile<V>
// CHECK-NEXT:     %[[g:[a-z_0-9]+]] = k3s.load_gate %g, %A_log, %dt_bias <gate = scalar, input = bounded, lower_bound = -3.0> : !k3s.tile<>
// CHECK-NEXT:     %S_2 = k3s.decay %S_1, %[[g]] <gate = scalar> : !k3s.tile<K x V>
// CHECK-NEXT:     %[[beta:[a-z_0-9]+]] = k3s.load_beta %beta <input = probability> : !k3s.tile<>
// CHECK-NEXT:     %u = k3s.delta_correct %S_2, %[[k]], %[[v]], %[[beta]] : !k3s.tile<V>
// CHECK-NEXT:     %S_3 = k3s.rank1_update %S_2, %[[k]], %u : !k3s.tile<K x V>
// CHECK-NEXT:     %{{[a-z_0-9]+}} = k3s.readout %S_3, %[[q]], %o, %scale : !k3s.tile<V>
// CHECK-NEXT:     k3s.next_token %S_3
// CHECK-NEXT:   } : !k3s.tile<K x V>

// SOFTPLUS:      k3.recurrence @gdn <{{.*}}, dtype = float32, gate_input = softplus>
// SOFTPLUS:      %A_log = k3s.tensor_arg @A_log <role = input> : !k3s.tensor<4, float>
// SOFTPLUS-NEXT: %dt_bias = k3s.tensor_arg @dt_bias <role = input> : !k3s.tensor<4, float>
// SOFTPLUS:      %[[g:[a-z_0-9]+]] = k3s.load_gate %g, %A_log, %dt_bias <gate = scalar, input = softplus, lower_bound = -5.0, floor = -110.0> : !k3s.tile<>
// SOFTPLUS-NEXT: %S_2 = k3s.decay %S_1, %[[g]] <gate = scalar> : !k3s.tile<K x V>

// CHUNK:       k3s.entry @chunk <source = @gdn> {
// CHUNK:         %[[G:[A-Za-z_0-9]+]] = k3s.tensor_arg @g <role = input> : !k3s.tensor<B x T x 4, float>
// CHUNK:         %[[ALOG:[A-Za-z_0-9]+]] = k3s.tensor_arg @A_log <role = input> : !k3s.tensor<4, float>
// CHUNK-NEXT:    %[[DTBIAS:[A-Za-z_0-9]+]] = k3s.tensor_arg @dt_bias <role = input> : !k3s.tensor<4, float>
// CHUNK:         k3s.kernel @gdn_chunk_prepare
// CHUNK-NEXT:      k3s.chunk_tile
// CHUNK-NEXT:      %[[g:[a-z_0-9]+]] = k3s.load_gate %[[G]], %[[ALOG]], %[[DTBIAS]] <gate = scalar, input = bounded, lower_bound = -3.0> : !k3s.tile<C>
// CHUNK-NEXT:      %G = k3s.gate_cumsum %[[g]] <gate = scalar> : !k3s.tile<C>
// CHUNK:         k3s.kernel @gdn_chunk_scan
// CHUNK-NOT:       k3s.load_gate
// CHUNK:           %{{[A-Za-z_0-9]+}} = k3s.reload %gamma_C : !k3s.tile<>
// CHUNK-NOT:       k3s.load_gate
// CHUNK:         k3s.store_state

// GLA:      %beta = k3s.tensor_arg @beta <role = forbidden> : !k3s.tensor<B x T x 4, float>
// GLA:      %A_log = k3s.tensor_arg @A_log <role = input> : !k3s.tensor<4, float>
// GLA-NEXT: %dt_bias = k3s.tensor_arg @dt_bias <role = input> : !k3s.tensor<96, float>
// GLA-NOT:  k3s.load_beta
// GLA:      %[[k:[a-z_0-9]+]] = k3s.load_token %k : !k3s.tile<K>
// GLA-NEXT: %[[v:[a-z_0-9]+]] = k3s.load_token %v : !k3s.tile<V>
// GLA-NEXT: %[[g:[a-z_0-9]+]] = k3s.load_gate %g, %A_log, %dt_bias <gate = channel, input = softplus, lower_bound = -5.0, floor = -110.0> : !k3s.tile<K>
// GLA-NEXT: %S_2 = k3s.decay %S_1, %[[g]] <gate = channel> : !k3s.tile<K x V>
// GLA-NEXT: %S_3 = k3s.rank1_update %S_2, %[[k]], %[[v]] : !k3s.tile<K x V>
// GLA-NOT:  k3s.load_beta
