// lower-recurrent on DeltaNet (no gate, delta rule): no gate load and no decay stage at all, g
// and the gate's parameters A_log and dt_bias are forbidden (the member has no gate input); beta
// is a required input, loaded as given before the delta correction.
// RUN: k3c opt %s -p lower-recurrent | filecheck %s
// RUN: k3c opt %s -p lower-recurrent | k3c opt - | filecheck %s

builtin.module {
  k3.recurrence @deltanet <gate = none, delta_rule = true, num_heads = 4, num_v_heads = 4, head_k_dim = 64, head_v_dim = 32, scale = 0.125, state_layout = kv, dtype = bfloat16>
}

// CHECK:      k3s.entry @recurrent <source = @deltanet> {
// CHECK:        %g = k3s.tensor_arg @g <role = forbidden> : !k3s.tensor<B x T x 4, float>
// CHECK-NEXT:   %beta = k3s.tensor_arg @beta <role = input> : !k3s.tensor<B x T x 4, float>
// CHECK:        %A_log = k3s.tensor_arg @A_log <role = forbidden> : !k3s.tensor<4, float>
// CHECK-NEXT:   %dt_bias = k3s.tensor_arg @dt_bias <role = forbidden> : !k3s.tensor<4, float>
// CHECK-NOT:    k3s.load_gate
// CHECK-NOT:    k3s.decay
// CHECK:        %S_final = k3s.token_loop %S, %cu_seqlens {
// CHECK-NEXT:   ^bb0(%S_1: !k3s.tile<K x V>):
// CHECK-NEXT:     %[[q:[a-z_0-9]+]] = k3s.load_token %q : !k3s.tile<K>
// CHECK-NEXT:     %[[k:[a-z_0-9]+]] = k3s.load_token %k : !k3s.tile<K>
// CHECK-NEXT:     %[[v:[a-z_0-9]+]] = k3s.load_token %v : !k3s.tile<V>
// CHECK-NEXT:     %[[beta:[a-z_0-9]+]] = k3s.load_beta %beta <input = probability> : !k3s.tile<>
// CHECK-NEXT:     %u = k3s.delta_correct %S_1, %[[k]], %[[v]], %[[beta]] : !k3s.tile<V>
// CHECK-NEXT:     %S_2 = k3s.rank1_update %S_1, %[[k]], %u : !k3s.tile<K x V>
// CHECK-NEXT:     %{{[a-z_0-9]+}} = k3s.readout %S_2, %[[q]], %o, %scale : !k3s.tile<V>
// CHECK-NEXT:     k3s.next_token %S_2
// CHECK-NEXT:   } : !k3s.tile<K x V>
// CHECK-NOT:    k3s.load_gate
// CHECK-NOT:    k3s.decay
