// The k3s load stages that carry what an input means, written by hand: load_token / load_chunk
// with and without l2norm, load_gate (gate, input form, lower bound) and load_beta (input
// form). Custom form prints back unchanged; generic form re-parses to it; printing is a fixed point.
// RUN: k3c opt %s | filecheck %s --match-full-lines
// RUN: k3c opt %s --generic | k3c opt - | filecheck %s --match-full-lines
// RUN: k3c opt %s --generic | filecheck %s --check-prefix=GENERIC
// RUN: k3c opt %s > %t.once && k3c opt %t.once > %t.twice && diff %t.once %t.twice

builtin.module {
  k3s.entry @recurrent <source = layer> {
    %A_log = k3s.tensor_arg @A_log <role = input> : !k3s.tensor<4, float>
    %dt_bias = k3s.tensor_arg @dt_bias <role = input> : !k3s.tensor<64, float>
    k3s.kernel @layer_recurrent <grid = "value_block,sequence_head", num_warps = 2> {
      k3s.state_tile <head_k_dim = 16, head_v_dim = 8, block_v = 8, layout = kv>
      k3s.token_loop {
      ^bb0(%S: !k3s.tile<K x V>):
        %q = k3s.load_token <tensor = q, l2norm = true> : !k3s.tile<K>
        %k = k3s.load_token <tensor = k, l2norm = true> : !k3s.tile<K>
        %v = k3s.load_token <tensor = v> : !k3s.tile<V>
        %g = k3s.load_gate <gate = channel, input = softplus, lower_bound = -5.0> : !k3s.tile<K>
        %S_1 = k3s.decay %S, %g <gate = channel> : !k3s.tile<K x V>
        %beta = k3s.load_beta <input = logits> : !k3s.tile<>
        %v_1 = k3s.delta_correct %S_1, %k, %v, %beta : !k3s.tile<V>
        %S_2 = k3s.rank1_update %S_1, %k, %v_1 : !k3s.tile<K x V>
        %o = k3s.readout %S_2, %q : !k3s.tile<V>
        k3s.next_token %S_2
      }
      k3s.store_state <layout = kv>
    }
    k3s.kernel @layer_chunk_prepare <grid = "chunk,value_head", num_warps = 4> {
      k3s.chunk_tile <chunk_size = 16, head_k_dim = 16, head_v_dim = 8>
      %g = k3s.load_gate <gate = scalar, input = bounded, lower_bound = -2.5> : !k3s.tile<C>
      %k = k3s.load_chunk <tensor = k, l2norm = true> : !k3s.tile<C x K>
      %beta = k3s.load_beta <input = probability> : !k3s.tile<C>
      %v = k3s.load_chunk <tensor = v> : !k3s.tile<C x V>
      %q = k3s.load_chunk <tensor = q> : !k3s.tile<C x K>
    }
  }
}

// CHECK:      builtin.module {
// CHECK-NEXT:   k3s.entry @recurrent <source = layer> {
// CHECK-NEXT:     %A_log = k3s.tensor_arg @A_log <role = input> : !k3s.tensor<4, float>
// CHECK-NEXT:     %dt_bias = k3s.tensor_arg @dt_bias <role = input> : !k3s.tensor<64, float>
// CHECK-NEXT:     k3s.kernel @layer_recurrent <grid = "value_block,sequence_head", num_warps = 2> {
// CHECK-NEXT:       k3s.state_tile <head_k_dim = 16, head_v_dim = 8, block_v = 8, layout = kv>
// CHECK-NEXT:       k3s.token_loop {
// CHECK-NEXT:       ^bb0(%S: !k3s.tile<K x V>):
// CHECK-NEXT:         %q = k3s.load_token <tensor = q, l2norm = true> : !k3s.tile<K>
// CHECK-NEXT:         %k = k3s.load_token <tensor = k, l2norm = true> : !k3s.tile<K>
// CHECK-NEXT:         %v = k3s.load_token <tensor = v> : !k3s.tile<V>
// CHECK-NEXT:         %g = k3s.load_gate <gate = channel, input = softplus, lower_bound = -5.0> : !k3s.tile<K>
// CHECK-NEXT:         %S_1 = k3s.decay %S, %g <gate = channel> : !k3s.tile<K x V>
// CHECK-NEXT:         %beta = k3s.load_beta <input = logits> : !k3s.tile<>
// CHECK-NEXT:         %v_1 = k3s.delta_correct %S_1, %k, %v, %beta : !k3s.tile<V>
// CHECK-NEXT:         %S_2 = k3s.rank1_update %S_1, %k, %v_1 : !k3s.tile<K x V>
// CHECK-NEXT:         %o = k3s.readout %S_2, %q : !k3s.tile<V>
// CHECK-NEXT:         k3s.next_token %S_2
// CHECK-NEXT:       }
// CHECK-NEXT:       k3s.store_state <layout = kv>
// CHECK-NEXT:     }
// CHECK-NEXT:     k3s.kernel @layer_chunk_prepare <grid = "chunk,value_head", num_warps = 4> {
// CHECK-NEXT:       k3s.chunk_tile <chunk_size = 16, head_k_dim = 16, head_v_dim = 8>
// CHECK-NEXT:       %g = k3s.load_gate <gate = scalar, input = bounded, lower_bound = -2.5> : !k3s.tile<C>
// CHECK-NEXT:       %k = k3s.load_chunk <tensor = k, l2norm = true> : !k3s.tile<C x K>
// CHECK-NEXT:       %beta = k3s.load_beta <input = probability> : !k3s.tile<C>
// CHECK-NEXT:       %v = k3s.load_chunk <tensor = v> : !k3s.tile<C x V>
// CHECK-NEXT:       %q = k3s.load_chunk <tensor = q> : !k3s.tile<C x K>
// CHECK-NEXT:     }
// CHECK-NEXT:   }
// CHECK-NEXT: }

// GENERIC:      %q = "k3s.load_token"() <{tensor = #k3s<token_tensor q>, l2norm = true}> : () -> !k3s.tile<K>
// GENERIC-NEXT: %k = "k3s.load_token"() <{tensor = #k3s<token_tensor k>, l2norm = true}> : () -> !k3s.tile<K>
// GENERIC-NEXT: %v = "k3s.load_token"() <{tensor = #k3s<token_tensor v>}> : () -> !k3s.tile<V>
// GENERIC-NEXT: %g = "k3s.load_gate"() <{gate = #k3<gate channel>, input = #k3<gate_input softplus>, lower_bound = -5.000000e+00 : f64}> : () -> !k3s.tile<K>
// GENERIC-NEXT: %S_1 = "k3s.decay"(%S, %g) <{gate = #k3<gate channel>}> : (!k3s.tile<K x V>, !k3s.tile<K>) -> !k3s.tile<K x V>
// GENERIC-NEXT: %beta = "k3s.load_beta"() <{input = #k3<beta_input logits>}> : () -> !k3s.tile<>
// GENERIC:      %g = "k3s.load_gate"() <{gate = #k3<gate scalar>, input = #k3<gate_input bounded>, lower_bound = -2.500000e+00 : f64}> : () -> !k3s.tile<C>
// GENERIC-NEXT: %k = "k3s.load_chunk"() <{tensor = #k3s<token_tensor k>, l2norm = true}> : () -> !k3s.tile<C x K>
// GENERIC-NEXT: %beta = "k3s.load_beta"() <{input = #k3<beta_input probability>}> : () -> !k3s.tile<C>
// GENERIC-NEXT: %v = "k3s.load_chunk"() <{tensor = #k3s<token_tensor v>}> : () -> !k3s.tile<C x V>
// GENERIC-NEXT: %q = "k3s.load_chunk"() <{tensor = #k3s<token_tensor q>}> : () -> !k3s.tile<C x K>
