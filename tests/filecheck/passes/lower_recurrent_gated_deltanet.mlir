// lower-recurrent on Gated DeltaNet (scalar gate + delta rule): the decay is per head
// (load_gate and decay <gate = scalar>), so g has no key-channel dimension and dt_bias (forbidden
// with a log-space gate input, like A_log) has one entry per value head; beta is an input.
// RUN: k3c opt %s -p lower-recurrent | filecheck %s
// RUN: k3c opt %s -p lower-recurrent | k3c opt - | filecheck %s

builtin.module {
  k3.recurrence @gdn <gate = scalar, delta_rule = true, num_heads = 4, num_v_heads = 4, head_k_dim = 64, head_v_dim = 32, scale = 0.125, state_layout = kv, dtype = bfloat16>
}

// CHECK:      k3s.entry @recurrent <source = @gdn> {
// CHECK:        %g = k3s.tensor_arg @g <role = input> : !k3s.tensor<B x T x 4, float>
// CHECK-NEXT:   %beta = k3s.tensor_arg @beta <role = input> : !k3s.tensor<B x T x 4, float>
// CHECK:        %A_log = k3s.tensor_arg @A_log <role = forbidden> : !k3s.tensor<4, float>
// CHECK-NEXT:   %dt_bias = k3s.tensor_arg @dt_bias <role = forbidden> : !k3s.tensor<4, float>
// CHECK:        k3s.kernel @gdn_recurrent <grid = [value_block, sequence_head], num_warps = 4> {
// CHECK:          %S_final = k3s.token_loop %S, %cu_seqlens {
// CHECK-NEXT:     ^bb0(%S_1: !k3s.tile<K x V>):
// CHECK-NEXT:       %[[q:[a-z_0-9]+]] = k3s.load_token %q : !k3s.tile<K>
// CHECK-NEXT:       %[[k:[a-z_0-9]+]] = k3s.load_token %k : !k3s.tile<K>
// CHECK-NEXT:       %[[v:[a-z_0-9]+]] = k3s.load_token %v : !k3s.tile<V>
// CHECK-NEXT:       %[[g:[a-z_0-9]+]] = k3s.load_gate %g <gate = scalar, input = log, lower_bound = -5.0, floor = -110.0> : !k3s.tile<>
// CHECK-NEXT:       %S_2 = k3s.decay %S_1, %[[g]] <gate = scalar> : !k3s.tile<K x V>
// CHECK-NEXT:       %[[beta:[a-z_0-9]+]] = k3s.load_beta %beta <input = probability> : !k3s.tile<>
// CHECK-NEXT:       %u = k3s.delta_correct %S_2, %[[k]], %[[v]], %[[beta]] : !k3s.tile<V>
// CHECK-NEXT:       %S_3 = k3s.rank1_update %S_2, %[[k]], %u : !k3s.tile<K x V>
// CHECK-NEXT:       %{{[a-z_0-9]+}} = k3s.readout %S_3, %[[q]], %o, %scale : !k3s.tile<V>
// CHECK-NEXT:       k3s.next_token %S_3
// CHECK-NEXT:     } : !k3s.tile<K x V>
