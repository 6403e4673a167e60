// lower-recurrent on a KDA layer (channel gate + delta rule): the layer op stays and a
// `recurrent` entry is added after it, with fla's tensor interface and one kernel whose token
// loop loads q, k, v, loads the gate (log-decay, as given) and decays the state per key channel,
// loads beta (a probability, as given) and applies the delta correction, then the rank-1 update
// and the readout. The in-kernel gate's parameters A_log and dt_bias are forbidden with a
// log-space gate input. Every stage that touches memory takes the entry's tensor as an operand:
// the state tile initial_state, the token loop cu_seqlens, the loads q, k, v, g and beta, the
// readout o and scale, the store final_state. Default options: block_v = 32, num_warps = 4.
// RUN: k3c opt %s -p lower-recurrent | filecheck %s
// The lowered IR re-parses (custom -> custom, and generic -> custom) to the same text.
// RUN: k3c opt %s -p lower-recurrent | k3c opt - | filecheck %s
// RUN: k3c opt %s -p lower-recurrent --generic | k3c opt - | filecheck %s

builtin.module {
  k3.recurrence @kda <gate = channel, delta_rule = true, num_heads = 4, num_v_heads = 4, head_k_dim = 64, head_v_dim = 32, scale = 0.125, state_layout = kv, dtype = bfloat16>
}

// CHECK:      builtin.module {
// CHECK-NEXT:   k3.recurrence @kda <gate = channel, delta_rule = true, num_heads = 4, num_v_heads = 4, head_k_dim = 64, head_v_dim = 32, scale = 0.125, state_layout = kv, dtype = bfloat16>
// CHECK-NEXT:   k3s.entry @recurrent <source = @kda> {
// CHECK-NEXT:     %[[Q:[A-Za-z_0-9]+]] = k3s.tensor_arg @q <role = input> : !k3s.tensor<B x T x 4 x 64, float>
// CHECK-NEXT:     %[[K:[A-Za-z_0-9]+]] = k3s.tensor_arg @k <role = input> : !k3s.tensor<B x T x 4 x 64, float>
// CHECK-NEXT:     %[[V:[A-Za-z_0-9]+]] = k3s.tensor_arg @v <role = input> : !k3s.tensor<B x T x 4 x 32, float>
// CHECK-NEXT:     %[[G:[A-Za-z_0-9]+]] = k3s.tensor_arg @g <role = input> : !k3s.tensor<B x T x 4 x 64, float>
// CHECK-NEXT:     %[[BETA:[A-Za-z_0-9]+]] = k3s.tensor_arg @beta <role = input> : !k3s.tensor<B x T x 4, float>
// CHECK-NEXT:     %[[SCALE:[A-Za-z_0-9]+]] = k3s.scalar_arg @scale <default = 0.125> : f32
// CHECK-NEXT:     %[[H0:[A-Za-z_0-9]+]] = k3s.tensor_arg @initial_state <role = optional_input> : !k3s.tensor<N x 4 x 64 x 32, float32>
// CHECK-NEXT:     %[[O:[A-Za-z_0-9]+]] = k3s.tensor_arg @o <role = output> : !k3s.tensor<B x T x 4 x 32, float>
// CHECK-NEXT:     %[[HT:[A-Za-z_0-9]+]] = k3s.tensor_arg @final_state <role = optional_output> : !k3s.tensor<N x 4 x 64 x 32, float32>
// CHECK-NEXT:     %[[CU:[A-Za-z_0-9]+]] = k3s.tensor_arg @cu_seqlens <role = optional_input, purpose = sequence_offsets> : !k3s.tensor<N+1, offsets>
// CHECK-NEXT:     %A_log = k3s.tensor_arg @A_log <role = forbidden> : !k3s.tensor<4, float>
// CHECK-NEXT:     %dt_bias = k3s.tensor_arg @dt_bias <role = forbidden> : !k3s.tensor<256, float>
// CHECK-NEXT:     k3s.kernel @kda_recurrent <grid = [value_block, sequence_head], num_warps = 4> {
// CHECK-NEXT:       %S = k3s.state_tile %[[H0]] <head_k_dim = 64, head_v_dim = 32, block_v = 32, layout = kv> : !k3s.tile<K x V>
// CHECK-NEXT:       %S_final = k3s.token_loop %S, %[[CU]] {
// CHECK-NEXT:       ^bb0(%S_1: !k3s.tile<K x V>):
// CHECK-NEXT:         %[[q:[A-Za-z_0-9]+]] = k3s.load_token %[[Q]] : !k3s.tile<K>
// CHECK-NEXT:         %[[k:[A-Za-z_0-9]+]] = k3s.load_token %[[K]] : !k3s.tile<K>
// CHECK-NEXT:         %[[v:[A-Za-z_0-9]+]] = k3s.load_token %[[V]] : !k3s.tile<V>
// CHECK-NEXT:         %[[g:[A-Za-z_0-9]+]] = k3s.load_gate %[[G]] <gate = channel, input = log, lower_bound = -5.0, floor = -110.0> : !k3s.tile<K>
// CHECK-NEXT:         %S_2 = k3s.decay %S_1, %[[g]] <gate = channel> : !k3s.tile<K x V>
// CHECK-NEXT:         %[[beta:[A-Za-z_0-9]+]] = k3s.load_beta %[[BETA]] <input = probability> : !k3s.tile<>
// CHECK-NEXT:         %u = k3s.delta_correct %S_2, %[[k]], %[[v]], %[[beta]] : !k3s.tile<V>
// CHECK-NEXT:         %S_3 = k3s.rank1_update %S_2, %[[k]], %u : !k3s.tile<K x V>
// CHECK-NEXT:         %{{[A-Za-z_0-9]+}} = k3s.readout %S_3, %[[q]], %[[O]], %[[SCALE]] : !k3s.tile<V>
// CHECK-NEXT:         k3s.next_token %S_3
// CHECK-NEXT:       } : !k3s.tile<K x V>
// CHECK-NEXT:       k3s.store_state %S_final, %[[HT]] <layout = kv>
// CHECK-NEXT:     }
// CHECK-NEXT:   }
// CHECK-NEXT: }
