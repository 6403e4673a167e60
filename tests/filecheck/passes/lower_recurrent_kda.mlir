// lower-recurrent on a KDA layer (channel gate + delta rule): the layer op stays and a
// `recurrent` entry is added after it, with fla's tensor interface and one kernel whose token
// loop loads q, k, v, loads the gate (log-decay, as given) and decays the state per key channel,
// loads beta (a probability, as given) and applies the delta correction, then the rank-1 update
// and the readout. The in-kernel gate's parameters A_log and dt_bias are forbidden with a
// log-space gate input. Default options: block_v = 32, num_warps = 4.
// RUN: k3c opt %s -p lower-recurrent | filecheck %s
// The lowered IR re-parses (custom -> custom, and generic -> custom) to the same text.
// RUN: k3c opt %s -p lower-recurrent | k3c opt - | filecheck %s
// RUN: k3c opt %s -p lower-recurrent --generic | k3c opt - | filecheck %s

builtin.module {
  k3.recurrence @kda <gate = channel, delta_rule = true, num_heads = 4, num_v_heads = 4, head_k_dim = 64, head_v_dim = 32, scale = 0.125, state_layout = kv, dtype = bfloat16>
}

// CHECK:      builtin.module {
// CHECK-NEXT:   k3.recurrence @kda <gate = channel, delta_rule = true, num_heads = 4, num_v_heads = 4, head_k_dim = 64, head_v_dim = 32, scale = 0.125, state_layout = kv, dtype = bfloat16>
// CHECK-NEXT:   k3s.entry @recurrent <source = kda> {
// CHECK-NEXT:     k3s.tensor_arg @q <shape = "B,T,4,64", dtype = float, role = input>
// CHECK-NEXT:     k3s.tensor_arg @k <shape = "B,T,4,64", dtype = float, role = input>
// CHECK-NEXT:     k3s.tensor_arg @v <shape = "B,T,4,32", dtype = float, role = input>
// CHECK-NEXT:     k3s.tensor_arg @g <shape = "B,T,4,64", dtype = float, role = input>
// CHECK-NEXT:     k3s.tensor_arg @beta <shape = "B,T,4", dtype = float, role = input>
// CHECK-NEXT:     k3s.scalar_arg @scale <default = 0.125>
// CHECK-NEXT:     k3s.tensor_arg @initial_state <shape = "N,4,64,32", dtype = float32, role = optional_input>
// CHECK-NEXT:     k3s.tensor_arg @o <shape = "B,T,4,32", dtype = float, role = output>
// CHECK-NEXT:     k3s.tensor_arg @final_state <shape = "N,4,64,32", dtype = float32, role = optional_output>
// CHECK-NEXT:     k3s.tensor_arg @cu_seqlens <shape = "N+1", dtype = offsets, role = optional_input>
// CHECK-NEXT:     k3s.tensor_arg @A_log <shape = "4", dtype = float, role = forbidden>
// CHECK-NEXT:     k3s.tensor_arg @dt_bias <shape = "256", dtype = float, role = forbidden>
// CHECK-NEXT:     k3s.kernel @kda_recurrent <grid = "value_block,sequence_head", num_warps = 4> {
// CHECK-NEXT:       k3s.state_tile <head_k_dim = 64, head_v_dim = 32, block_v = 32, layout = kv>
// CHECK-NEXT:       k3s.token_loop {
// CHECK-NEXT:       ^bb0(%S: !k3s.tile<K x V>):
// CHECK-NEXT:         %q = k3s.load_token <tensor = q> : !k3s.tile<K>
// CHECK-NEXT:         %k = k3s.load_token <tensor = k> : !k3s.tile<K>
// CHECK-NEXT:         %v = k3s.load_token <tensor = v> : !k3s.tile<V>
// CHECK-NEXT:         %g = k3s.load_gate <gate = channel, input = log, lower_bound = -5.0> : !k3s.tile<K>
// CHECK-NEXT:         %S_1 = k3s.decay %S, %g <gate = channel> : !k3s.tile<K x V>
// CHECK-NEXT:         %beta = k3s.load_beta <input = probability> : !k3s.tile<>
// CHECK-NEXT:         %u = k3s.delta_correct %S_1, %k, %v, %beta : !k3s.tile<V>
// CHECK-NEXT:         %S_2 = k3s.rank1_update %S_1, %k, %u : !k3s.tile<K x V>
// CHECK-NEXT:         %o = k3s.readout %S_2, %q : !k3s.tile<V>
// CHECK-NEXT:         k3s.next_token %S_2
// CHECK-NEXT:       }
// CHECK-NEXT:       k3s.store_state <layout = kv>
// CHECK-NEXT:     }
// CHECK-NEXT:   }
// CHECK-NEXT: }
