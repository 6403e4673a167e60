// The k3s schedule dialect, written by hand: a recurrent entry with its arguments, a kernel and
// nested stage regions. Custom form prints back unchanged; generic form re-parses to it.
// RUN: k3c opt %s | filecheck %s --match-full-lines
// RUN: k3c opt %s --generic | k3c opt - | filecheck %s --match-full-lines
// RUN: k3c opt %s --generic | filecheck %s --check-prefix=GENERIC
// RUN: k3c opt %s > %t.once && k3c opt %t.once > %t.twice && diff %t.once %t.twice

builtin.module {
  k3.recurrence @layer <gate = scalar, delta_rule = true, num_heads = 2, num_v_heads = 4, head_k_dim = 16, head_v_dim = 8, scale = 0.25, state_layout = vk, dtype = float32>
  k3s.entry @recurrent <source = @layer> {
    %q = k3s.tensor_arg @q <role = input> : !k3s.tensor<B x T x 2 x 16, float>
    %k = k3s.tensor_arg @k <role = input> : !k3s.tensor<B x T x 2 x 16, float>
    %v = k3s.tensor_arg @v <role = input> : !k3s.tensor<B x T x 4 x 8, float>
    %g = k3s.tensor_arg @g <role = input> : !k3s.tensor<B x T x 4, float>
    %beta = k3s.tensor_arg @beta <role = input> : !k3s.tensor<B x T x 4, float>
    %scale = k3s.scalar_arg @scale <default = 0.25> : f32
    %initial_state = k3s.tensor_arg @initial_state <role = optional_input> : !k3s.tensor<N x 4 x 8 x 16, float32>
    %o = k3s.tensor_arg @o <role = output> : !k3s.tensor<B x T x 4 x 8, float>
    %final_state = k3s.tensor_arg @final_state <role = optional_output> : !k3s.tensor<N x 4 x 8 x 16, float32>
    %cu_seqlens = k3s.tensor_arg @cu_seqlens <role = optional_input, purpose = sequence_offsets> : !k3s.tensor<N+1, offsets>
    k3s.kernel @layer_recurrent <grid = [value_block, sequence_head], num_warps = 2> {
      %S0 = k3s.state_tile %initial_state <head_k_dim = 16, head_v_dim = 8, block_v = 8, layout = vk> : !k3s.tile<K x V>
      %S_final = k3s.token_loop %S0, %cu_seqlens {
      ^bb0(%S: !k3s.tile<K x V>):
        %q_1 = k3s.load_token %q : !k3s.tile<K>
        %k_1 = k3s.load_token %k : !k3s.tile<K>
        %v_1 = k3s.load_token %v : !k3s.tile<V>
        %g_1 = k3s.load_gate %g <gate = scalar, input = log, lower_bound = -5.0> : !k3s.tile<>
        %S_1 = k3s.decay %S, %g_1 <gate = scalar> : !k3s.tile<K x V>
        %beta_1 = k3s.load_beta %beta <input = probability> : !k3s.tile<>
        %v_2 = k3s.delta_correct %S_1, %k_1, %v_1, %beta_1 : !k3s.tile<V>
        %S_2 = k3s.rank1_update %S_1, %k_1, %v_2 : !k3s.tile<K x V>
        %o_1 = k3s.readout %S_2, %q_1, %o, %scale : !k3s.tile<V>
        k3s.next_token %S_2
      } : !k3s.tile<K x V>
      k3s.store_state %S_final, %final_state <layout = vk>
    }
  }
}

// CHECK:      builtin.module {
// CHECK-NEXT:   k3.recurrence @layer <gate = scalar, delta_rule = true, num_heads = 2, num_v_heads = 4, head_k_dim = 16, head_v_dim = 8, scale = 0.25, state_layout = vk, dtype = float32>
// CHECK-NEXT:   k3s.entry @recurrent <source = @layer> {
// CHECK-NEXT:     %q = k3s.tensor_arg @q <role = input> : !k3s.tensor<B x T x 2 x 16, float>
// CHECK-NEXT:     %k = k3s.tensor_arg @k <role = input> : !k3s.tensor<B x T x 2 x 16, float>
// CHECK-NEXT:     %v = k3s.tensor_arg @v <role = input> : !k3s.tensor<B x T x 4 x 8, float>
// CHECK-NEXT:     %g = k3s.tensor_arg @g <role = input> : !k3s.tensor<B x T x 4, float>
// CHECK-NEXT:     %beta = k3s.tensor_arg @beta <role = input> : !k3s.tensor<B x T x 4, float>
// CHECK-NEXT:     %scale = k3s.scalar_arg @scale <default = 0.25> : f32
// CHECK-NEXT:     %initial_state = k3s.tensor_arg @initial_state <role = optional_input> : !k3s.tensor<N x 4 x 8 x 16, float32>
// CHECK-NEXT:     %o = k3s.tensor_arg @o <role = output> : !k3s.tensor<B x T x 4 x 8, float>
// CHECK-NEXT:     %final_state = k3s.tensor_arg @final_state <role = optional_output> : !k3s.tensor<N x 4 x 8 x 16, float32>
// CHECK-NEXT:     %cu_seqlens = k3s.tensor_arg @cu_seqlens <role = optional_input, purpose = sequence_offsets> : !k3s.tensor<N+1, offsets>
// CHECK-NEXT:     k3s.kernel @layer_recurrent <grid = [value_block, sequence_head], num_warps = 2> {
// CHECK-NEXT:       %S0 = k3s.state_tile %initial_state <head_k_dim = 16, head_v_dim = 8, block_v = 8, layout = vk> : !k3s.tile<K x V>
// CHECK-NEXT:       %S_final = k3s.token_loop %S0, %cu_seqlens {
// CHECK-NEXT:       ^bb0(%S: !k3s.tile<K x V>):
// CHECK-NEXT:         %q_1 = k3s.load_token %q : !k3s.tile<K>
// CHECK-NEXT:         %k_1 = k3s.load_token %k : !k3s.tile<K>
// CHECK-NEXT:         %v_1 = k3s.load_token %v : !k3s.tile<V>
// CHECK-NEXT:         %g_1 = k3s.load_gate %g <gate = scalar, input = log, lower_bound = -5.0> : !k3s.tile<>
// CHECK-NEXT:         %S_1 = k3s.decay %S, %g_1 <gate = scalar> : !k3s.tile<K x V>
// CHECK-NEXT:         %beta_1 = k3s.load_beta %beta <input = probability> : !k3s.tile<>
// CHECK-NEXT:         %v_2 = k3s.delta_correct %S_1, %k_1, %v_1, %beta_1 : !k3s.tile<V>
// CHECK-NEXT:         %S_2 = k3s.rank1_update %S_1, %k_1, %v_2 : !k3s.tile<K x V>
// CHECK-NEXT:         %o_1 = k3s.readout %S_2, %q_1, %o, %scale : !k3s.tile<V>
// CHECK-NEXT:         k3s.next_token %S_2
// CHECK-NEXT:       } : !k3s.tile<K x V>
// CHECK-NEXT:       k3s.store_state %S_final, %final_state <layout = vk>
// CHECK-NEXT:     }
// CHECK-NEXT:   }
// CHECK-NEXT: }

// GENERIC:      "builtin.module"() ({
// GENERIC-NEXT:   "k3.recurrence"() <{sym_name = "layer", gate = #k3<gate scalar>, delta_rule = true, num_heads = 2 : i64, num_v_heads = 4 : i64, head_k_dim = 16 : i64, head_v_dim = 8 : i64, scale = 2.500000e-01 : f64, state_layout = #k3<state_layout vk>, dtype = #k3<dtype float32>}> : () -> ()
// GENERIC-NEXT:   "k3s.entry"() <{sym_name = "recurrent", source = @layer}> ({
// GENERIC-NEXT:     %q = "k3s.tensor_arg"() <{sym_name = "q", role = #k3s<arg_role input>}> : () -> !k3s.tensor<B x T x 2 x 16, float>
// GENERIC-NEXT:     %k = "k3s.tensor_arg"() <{sym_name = "k", role = #k3s<arg_role input>}> : () -> !k3s.tensor<B x T x 2 x 16, float>
// GENERIC-NEXT:     %v = "k3s.tensor_arg"() <{sym_name = "v", role = #k3s<arg_role input>}> : () -> !k3s.tensor<B x T x 4 x 8, float>
// GENERIC-NEXT:     %g = "k3s.tensor_arg"() <{sym_name = "g", role = #k3s<arg_role input>}> : () -> !k3s.tensor<B x T x 4, float>
// GENERIC-NEXT:     %beta = "k3s.tensor_arg"() <{sym_name = "beta", role = #k3s<arg_role input>}> : () -> !k3s.tensor<B x T x 4, float>
// GENERIC-NEXT:     %scale = "k3s.scalar_arg"() <{sym_name = "scale", default = 2.500000e-01 : f64}> : () -> f32
// GENERIC-NEXT:     %initial_state = "k3s.tensor_arg"() <{sym_name = "initial_state", role = #k3s<arg_role optional_input>}> : () -> !k3s.tensor<N x 4 x 8 x 16, float32>
// GENERIC-NEXT:     %o = "k3s.tensor_arg"() <{sym_name = "o", role = #k3s<arg_role output>}> : () -> !k3s.tensor<B x T x 4 x 8, float>
// GENERIC-NEXT:     %final_state = "k3s.tensor_arg"() <{sym_name = "final_state", role = #k3s<arg_role optional_output>}> : () -> !k3s.tensor<N x 4 x 8 x 16, float32>
// GENERIC-NEXT:     %cu_seqlens = "k3s.tensor_arg"() <{sym_name = "cu_seqlens", role = #k3s<arg_role optional_input>, purpose = #k3s<arg_purpose sequence_offsets>}> : () -> !k3s.tensor<N+1, offsets>
// GENERIC-NEXT:     "k3s.kernel"() <{sym_name = "layer_recurrent", grid = [#k3s<grid_axis value_block>, #k3s<grid_axis sequence_head>], num_warps = 2 : i64}> ({
// GENERIC-NEXT:       %S0 = "k3s.state_tile"(%initial_state) <{head_k_dim = 16 : i64, head_v_dim = 8 : i64, block_v = 8 : i64, layout = #k3<state_layout vk>}> : (!k3s.tensor<N x 4 x 8 x 16, float32>) -> !k3s.tile<K x V>
// GENERIC-NEXT:       %S_final = "k3s.token_loop"(%S0, %cu_seqlens) ({
// GENERIC-NEXT:       ^bb0(%S: !k3s.tile<K x V>):
// GENERIC-NEXT:         %q_1 = "k3s.load_token"(%q) : (!k3s.tensor<B x T x 2 x 16, float>) -> !k3s.tile<K>
// GENERIC-NEXT:         %k_1 = "k3s.load_token"(%k) : (!k3s.tensor<B x T x 2 x 16, float>) -> !k3s.tile<K>
// GENERIC-NEXT:         %v_1 = "k3s.load_token"(%v) : (!k3s.tensor<B x T x 4 x 8, float>) -> !k3s.tile<V>
// GENERIC-NEXT:         %g_1 = "k3s.load_gate"(%g) <{gate = #k3<gate scalar>, input = #k3<gate_input log>, lower_bound = -5.000000e+00 : f64}> : (!k3s.tensor<B x T x 4, float>) -> !k3s.tile<>
// GENERIC-NEXT:         %S_1 = "k3s.decay"(%S, %g_1) <{gate = #k3<gate scalar>}> : (!k3s.tile<K x V>, !k3s.tile<>) -> !k3s.tile<K x V>
// GENERIC-NEXT:         %beta_1 = "k3s.load_beta"(%beta) <{input = #k3<beta_input probability>}> : (!k3s.tensor<B x T x 4, float>) -> !k3s.tile<>
// GENERIC-NEXT:         %v_2 = "k3s.delta_correct"(%S_1, %k_1, %v_1, %beta_1) : (!k3s.tile<K x V>, !k3s.tile<K>, !k3s.tile<V>, !k3s.tile<>) -> !k3s.tile<V>
// GENERIC-NEXT:         %S_2 = "k3s.rank1_update"(%S_1, %k_1, %v_2) : (!k3s.tile<K x V>, !k3s.tile<K>, !k3s.tile<V>) -> !k3s.tile<K x V>
// GENERIC-NEXT:         %o_1 = "k3s.readout"(%S_2, %q_1, %o, %scale) : (!k3s.tile<K x V>, !k3s.tile<K>, !k3s.tensor<B x T x 4 x 8, float>, f32) -> !k3s.tile<V>
// GENERIC-NEXT:         "k3s.next_token"(%S_2) : (!k3s.tile<K x V>) -> ()
// GENERIC-NEXT:       }) : (!k3s.tile<K x V>, !k3s.tensor<N+1, offsets>) -> !k3s.tile<K x V>
// GENERIC-NEXT:       "k3s.store_state"(%S_final, %final_state) <{layout = #k3<state_layout vk>}> : (!k3s.tile<K x V>, !k3s.tensor<N x 4 x 8 x 16, float32>) -> ()
// GENERIC-NEXT:     }) : () -> ()
// GENERIC-NEXT:   }) : () -> ()
// GENERIC-NEXT: }) : () -> ()
