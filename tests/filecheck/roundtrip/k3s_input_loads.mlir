// The k3s load stages that carry what an input means, written by hand: load_token / load_chunk
// with and without l2norm, load_gate (gate, input form, lower bound; A_log and dt_bias after g
// for the forms that read them) and load_beta (input form), each reading its entry's tensor.
// Custom form prints back unchanged; generic form re-parses to it; printing is a fixed point.
// RUN: k3c opt %s | filecheck %s --match-full-lines
// RUN: k3c opt %s --generic | k3c opt - | filecheck %s --match-full-lines
// RUN: k3c opt %s --generic | filecheck %s --check-prefix=GENERIC
// RUN: k3c opt %s > %t.once && k3c opt %t.once > %t.twice && diff %t.once %t.twice

builtin.module {
  k3.recurrence @layer <gate = channel, delta_rule = true, num_heads = 2, num_v_heads = 4, head_k_dim = 16, head_v_dim = 8, scale = 0.25, state_layout = kv, dtype = float32>
  k3s.entry @recurrent <source = @layer> {
    %q = k3s.tensor_arg @q <role = input> : !k3s.tensor<B x T x 2 x 16, float>
    %k = k3s.tensor_arg @k <role = input> : !k3s.tensor<B x T x 2 x 16, float>
    %v = k3s.tensor_arg @v <role = input> : !k3s.tensor<B x T x 4 x 8, float>
    %g = k3s.tensor_arg @g <role = input> : !k3s.tensor<B x T x 4 x 16, float>
    %beta = k3s.tensor_arg @beta <role = input> : !k3s.tensor<B x T x 4, float>
    %scale = k3s.scalar_arg @scale <default = 0.25> : f32
    %initial_state = k3s.tensor_arg @initial_state <role = optional_input> : !k3s.tensor<N x 4 x 16 x 8, float32>
    %o = k3s.tensor_arg @o <role = output> : !k3s.tensor<B x T x 4 x 8, float>
    %final_state = k3s.tensor_arg @final_state <role = optional_output> : !k3s.tensor<N x 4 x 16 x 8, float32>
    %A_log = k3s.tensor_arg @A_log <role = input> : !k3s.tensor<4, float>
    %dt_bias = k3s.tensor_arg @dt_bias <role = input> : !k3s.tensor<64, float>
    k3s.kernel @layer_recurrent <grid = [value_block, sequence_head], num_warps = 2> {
      %S0 = k3s.state_tile %initial_state <head_k_dim = 16, head_v_dim = 8, block_v = 8, layout = kv> : !k3s.tile<K x V>
      %S_final = k3s.token_loop %S0 {
      ^bb0(%S: !k3s.tile<K x V>):
        %q_1 = k3s.load_token %q <l2norm = true> : !k3s.tile<K>
        %k_1 = k3s.load_token %k <l2norm = true> : !k3s.tile<K>
        %v_1 = k3s.load_token %v : !k3s.tile<V>
        %g_1 = k3s.load_gate %g, %A_log, %dt_bias <gate = channel, input = softplus, lower_bound = -5.0> : !k3s.tile<K>
        %S_1 = k3s.decay %S, %g_1 <gate = channel> : !k3s.tile<K x V>
        %beta_1 = k3s.load_beta %beta <input = logits> : !k3s.tile<>
        %v_2 = k3s.delta_correct %S_1, %k_1, %v_1, %beta_1 : !k3s.tile<V>
        %S_2 = k3s.rank1_update %S_1, %k_1, %v_2 : !k3s.tile<K x V>
        %o_1 = k3s.readout %S_2, %q_1, %o, %scale : !k3s.tile<V>
        k3s.next_token %S_2
      } : !k3s.tile<K x V>
      k3s.store_state %S_final, %final_state <layout = kv>
    }
  }
  k3s.entry @chunk <source = @layer> {
    %q_2 = k3s.tensor_arg @q <role = input> : !k3s.tensor<B x T x 2 x 16, float>
    %k_2 = k3s.tensor_arg @k <role = input> : !k3s.tensor<B x T x 2 x 16, float>
    %v_3 = k3s.tensor_arg @v <role = input> : !k3s.tensor<B x T x 4 x 8, float>
    %g_2 = k3s.tensor_arg @g <role = input> : !k3s.tensor<B x T x 4, float>
    %beta_2 = k3s.tensor_arg @beta <role = input> : !k3s.tensor<B x T x 4, float>
    %A_log_1 = k3s.tensor_arg @A_log <role = input> : !k3s.tensor<4, float>
    %dt_bias_1 = k3s.tensor_arg @dt_bias <role = input> : !k3s.tensor<4, float>
    k3s.kernel @layer_chunk_prepare <grid = [chunk, value_head], num_warps = 4> {
      k3s.chunk_tile <chunk_size = 16, head_k_dim = 16, head_v_dim = 8>
      %g_3 = k3s.load_gate %g_2, %A_log_1, %dt_bias_1 <gate = scalar, input = bounded, lower_bound = -2.5> : !k3s.tile<C>
      %k_3 = k3s.load_chunk %k_2 <l2norm = true> : !k3s.tile<C x K>
      %beta_3 = k3s.load_beta %beta_2 <input = probability> : !k3s.tile<C>
      %v_4 = k3s.load_chunk %v_3 : !k3s.tile<C x V>
      %q_3 = k3s.load_chunk %q_2 : !k3s.tile<C x K>
    }
  }
}


// GENERIC:      %q_1 = "k3s.load_token"(%q) <{l2norm = true}> : (!k3s.tensor<B x T x 2 x 16, float>) -> !k3s.tile<K>
// GENERIC-NEXT: %k_1 = "k3s.load_token"(%k) <{l2norm = true}> : (!k3s.tensor<B x T x 2 x 16, float>) -> !k3s.tile<K>
// GENERIC-NEXT: %v_1 = "k3s.load_token"(%v) : (!k3s.tensor<B x T x 4 x 8, float>) -> !k3s.tile<V>
// GENERIC-NEXT: %g_1 = "k3s.load_gate"(%g, %A_log, %dt_bias) <{gate = #k3<gate channel>, input = #k3<gate_input softplus>, lower_bound = -5.000000e+00 : f64}> : (!k3s.tensor<B x T x 4 x 16, float>, !k3s.tensor<4, float>, !k3s.tensor<64, float>) -> !k3s.tile<K>
// GENERIC-NEXT: %S_1 = "k3s.decay"(%S, %g_1) <{gate = #k3<gate channel>}> : (!k3s.tile<K x V>, !k3s.tile<K>) -> !k3s.tile<K x V>
// GENERIC-NEXT: %beta_1 = "k3s.load_beta"(%beta) <{input = #k3<beta_input logits>}> : (!k3s.tensor<B x T x 4, float>) -> !k3s.tile<>
// GENERIC:      %g_1 = "k3s.load_gate"(%g, %A_log, %dt_bias) <{gate = #k3<gate scalar>, input = #k3<gate_input bounded>, lower_bound = -2.500000e+00 : f64}> : (!k3s.tensor<B x T x 4, float>, !k3s.tensor<4, float>, !k3s.tensor<4, float>) -> !k3s.tile<C>
// GENERIC-NEXT: %k_1 = "k3s.load_chunk"(%k) <{l2norm = true}> : (!k3s.tensor<B x T x 2 x 16, float>) -> !k3s.tile<C x K>
// GENERIC-NEXT: %beta_1 = "k3s.load_beta"(%beta) <{input = #k3<beta_input probability>}> : (!k3s.tensor<B x T x 4, float>) -> !k3s.tile<C>
// GENERIC-NEXT: %v_1 = "k3s.load_chunk"(%v) : (!k3s.tensor<B x T x 4 x 8, float>) -> !k3s.tile<C x V>
// GENERIC-NEXT: %q_1 = "k3s.load_chunk"(%q) : (!k3s.tensor<B x T x 2 x 16, float>) -> !k3s.tile<C x K>

// CHECK:      builtin.module {
// CHECK-NEXT:   k3.recurrence @layer <gate = channel, delta_rule = true, num_heads = 2, num_v_heads = 4, head_k_dim = 16, head_v_dim = 8, scale = 0.25, state_layout = kv, dtype = float32>
// CHECK-NEXT:   k3s.entry @recurrent <source = @layer> {
// CHECK-NEXT:     %q = k3s.tensor_arg @q <role = input> : !k3s.tensor<B x T x 2 x 16, float>
// CHECK-NEXT:     %k = k3s.tensor_arg @k <role = input> : !k3s.tensor<B x T x 2 x 16, float>
// CHECK-NEXT:     %v = k3s.tensor_arg @v <role = input> : !k3s.tensor<B x T x 4 x 8, float>
// CHECK-NEXT:     %g = k3s.tensor_arg @g <role = input> : !k3s.tensor<B x T x 4 x 16, float>
// CHECK-NEXT:     %beta = k3s.tensor_arg @beta <role = input> : !k3s.tensor<B x T x 4, float>
// CHECK-NEXT:     %scale = k3s.scalar_arg @scale <default = 0.25> : f32
// CHECK-NEXT:     %initial_state = k3s.tensor_arg @initial_state <role = optional_input> : !k3s.tensor<N x 4 x 16 x 8, float32>
// CHECK-NEXT:     %o = k3s.tensor_arg @o <role = output> : !k3s.tensor<B x T x 4 x 8, float>
// CHECK-NEXT:     %final_state = k3s.tensor_arg @final_state <role = optional_output> : !k3s.tensor<N x 4 x 16 x 8, float32>
// CHECK-NEXT:     %A_log = k3s.tensor_arg @A_log <role = input> : !k3s.tensor<4, float>
// CHECK-NEXT:     %dt_bias = k3s.tensor_arg @dt_bias <role = input> : !k3s.tensor<64, float>
// CHECK-NEXT:     k3s.kernel @layer_recurrent <grid = [value_block, sequence_head], num_warps = 2> {
// CHECK-NEXT:       %S0 = k3s.state_tile %initial_state <head_k_dim = 16, head_v_dim = 8, block_v = 8, layout = kv> : !k3s.tile<K x V>
// CHECK-NEXT:       %S_final = k3s.token_loop %S0 {
// CHECK-NEXT:       ^bb0(%S: !k3s.tile<K x V>):
// CHECK-NEXT:         %q_1 = k3s.load_token %q <l2norm = true> : !k3s.tile<K>
// CHECK-NEXT:         %k_1 = k3s.load_token %k <l2norm = true> : !k3s.tile<K>
// CHECK-NEXT:         %v_1 = k3s.load_token %v : !k3s.tile<V>
// CHECK-NEXT:         %g_1 = k3s.load_gate %g, %A_log, %dt_bias <gate = channel, input = softplus, lower_bound = -5.0> : !k3s.tile<K>
// CHECK-NEXT:         %S_1 = k3s.decay %S, %g_1 <gate = channel> : !k3s.tile<K x V>
// CHECK-NEXT:         %beta_1 = k3s.load_beta %beta <input = logits> : !k3s.tile<>
// CHECK-NEXT:         %v_2 = k3s.delta_correct %S_1, %k_1, %v_1, %beta_1 : !k3s.tile<V>
// CHECK-NEXT:         %S_2 = k3s.rank1_update %S_1, %k_1, %v_2 : !k3s.tile<K x V>
// CHECK-NEXT:         %o_1 = k3s.readout %S_2, %q_1, %o, %scale : !k3s.tile<V>
// CHECK-NEXT:         k3s.next_token %S_2
// CHECK-NEXT:       } : !k3s.tile<K x V>
// CHECK-NEXT:       k3s.store_state %S_final, %final_state <layout = kv>
// CHECK-NEXT:     }
// CHECK-NEXT:   }
// CHECK-NEXT:   k3s.entry @chunk <source = @layer> {
// CHECK-NEXT:     %q = k3s.tensor_arg @q <role = input> : !k3s.tensor<B x T x 2 x 16, float>
// CHECK-NEXT:     %k = k3s.tensor_arg @k <role = input> : !k3s.tensor<B x T x 2 x 16, float>
// CHECK-NEXT:     %v = k3s.tensor_arg @v <role = input> : !k3s.tensor<B x T x 4 x 8, float>
// CHECK-NEXT:     %g = k3s.tensor_arg @g <role = input> : !k3s.tensor<B x T x 4, float>
// CHECK-NEXT:     %beta = k3s.tensor_arg @beta <role = input> : !k3s.tensor<B x T x 4, float>
// CHECK-NEXT:     %A_log = k3s.tensor_arg @A_log <role = input> : !k3s.tensor<4, float>
// CHECK-NEXT:     %dt_bias = k3s.tensor_arg @dt_bias <role = input> : !k3s.tensor<4, float>
// CHECK-NEXT:     k3s.kernel @layer_chunk_prepare <grid = [chunk, value_head], num_warps = 4> {
// CHECK-NEXT:       k3s.chunk_tile <chunk_size = 16, head_k_dim = 16, head_v_dim = 8>
// CHECK-NEXT:       %g_1 = k3s.load_gate %g, %A_log, %dt_bias <gate = scalar, input = bounded, lower_bound = -2.5> : !k3s.tile<C>
// CHECK-NEXT:       %k_1 = k3s.load_chunk %k <l2norm = true> : !k3s.tile<C x K>
// CHECK-NEXT:       %beta_1 = k3s.load_beta %beta <input = probability> : !k3s.tile<C>
// CHECK-NEXT:       %v_1 = k3s.load_chunk %v : !k3s.tile<C x V>
// CHECK-NEXT:       %q_1 = k3s.load_chunk %q : !k3s.tile<C x K>
// CHECK-NEXT:     }
// CHECK-NEXT:   }
// CHECK-NEXT: }
