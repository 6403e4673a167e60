// lower-recurrent on plain linear attention (no gate, no delta rule): the token loop is only
// loads, the rank-1 update and the readout; both g and beta are forbidden.
// RUN: k3c opt %s -p lower-recurrent | filecheck %s
// RUN: k3c opt %s -p lower-recurrent | k3c opt - | filecheck %s

builtin.module {
  k3.recurrence @linear <gate = none, delta_rule = false, num_heads = 2, num_v_heads = 2, head_k_dim = 16, head_v_dim = 16, scale = 0.25, state_layout = kv, dtype = float32>
}

// CHECK:      k3s.entry @recurrent <source = @linear> {
// CHECK:        %g = k3s.tensor_arg @g <role = forbidden> : !k3s.tensor<B x T x 2, float>
// CHECK-NEXT:   %beta = k3s.tensor_arg @beta <role = forbidden> : !k3s.tensor<B x T x 2, float>
// CHECK-NEXT:   %scale = k3s.scalar_arg @scale <default = 0.25> : f32
// CHECK:        %S_final = k3s.token_loop %S, %cu_seqlens {
// CHECK-NEXT:   ^bb0(%S_1: !k3s.tile<K x V>):
// CHECK-NEXT:     %[[q:[a-z_0-9]+]] = k3s.load_token %q : !k3s.tile<K>
// CHECK-NEXT:     %[[k:[a-z_0-9]+]] = k3s.load_token %k : !k3s.tile<K>
// CHECK-NEXT:     %[[v:[a-z_0-9]+]] = k3s.load_token %v : !k3s.tile<V>
// CHECK-NEXT:     %S_2 = k3s.rank1_update %S_1, %[[k]], %[[v]] : !k3s.tile<K x V>
// CHECK-NEXT:     %{{[a-z_0-9]+}} = k3s.readout %S_2, %[[q]], %o, %scale : !k3s.tile<V>
// CHECK-NEXT:     k3s.next_token %S_2
// CHECK-NEXT:   } : !k3s.tile<K x V>
