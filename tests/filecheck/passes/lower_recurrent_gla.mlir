// lower-recurrent on GLA (channel gate, no delta rule): the gate is loaded (log-decay, as given)
// and decays the state per key channel, then the plain rank-1 update k v^T with no beta load and
// no delta correction; beta is forbidden, g is an input, A_log and dt_bias [HV * K] are forbidden.
// RUN: k3c opt %s -p lower-recurrent | filecheck %s
// RUN: k3c opt %s -p lower-recurrent | k3c opt - | filecheck %s

builtin.module {
  k3.recurrence @gla <gate = channel, delta_rule = false, num_heads = 4, num_v_heads = 4, head_k_dim = 64, head_v_dim = 32, scale = 0.125, state_layout = kv, dtype = bfloat16>
}

// CHECK:      k3s.entry @recurrent <source = @gla> {
// CHECK:        %g = k3s.tensor_arg @g <role = input> : !k3s.tensor<B x T x 4 x 64, float>
// CHECK-NEXT:   %beta = k3s.tensor_arg @beta <role = forbidden> : !k3s.tensor<B x T x 4, float>
// CHECK:        %A_log = k3s.tensor_arg @A_log <role = forbidden> : !k3s.tensor<4, float>
// CHECK-NEXT:   %dt_bias = k3s.tensor_arg @dt_bias <role = forbidden> : !k3s.tensor<256, float>
// CHECK-NOT:    k3s.load_beta
// CHECK-NOT:    k3s.delta_correct
// CHECK:        %S_final = k3s.token_loop %S, %cu_seqlens {
// CHECK-NEXT:   ^bb0(%S_1: !k3s.tile<K x V>):
// CHECK-NEXT:     %[[q:[a-z_0-9]+]] = k3s.load_token %q : !k3s.tile<K>
// CHECK-NEXT:     %[[k:[a-z_0-9]+]] = k3s.load_token %k : !k3s.tile<K>
// CHECK-NEXT:     %[[v:[a-z_0-9]+]] = k3s.load_token %v : !k3s.tile<V>
// CHECK-NEXT:     %[[g:[a-z_0-9]+]] = k3s.load_gate %g <gate = channel, input = log, lower_bound = -5.0, floor = -110.0> : !k3s.tile<K>
// CHECK-NEXT:     %S_2 = k3s.decay %S_1, %[[g]] <gate = channel> : !k3s.tile<K x V>
// CHECK-NEXT:     %S_3 = k3s.rank1_update %S_2, %[[k]], %[[v]] : !k3s.tile<K x V>
// CHECK-NEXT:     %{{[a-z_0-9]+}} = k3s.readout %S_3, %[[q]], %o, %scale : !k3s.tile<V>
// CHECK-NEXT:     k3s.next_token %S_3
// CHECK-NEXT:   } : !k3s.tile<K x V>
// CHECK-NOT:    k3s.load_beta
// CHECK-NOT:    k3s.delta_correct
