// lower-recurrent on a KDA layer whose inputs are fla's raw ones: qk_l2norm (q and k are
// L2-normalised in the kernel, v is not), gate_input = softplus (g = -exp(A_log) softplus(g +
// dt_bias), so the gate's parameters A_log [HV] and dt_bias [HV * K] become inputs) and
// beta_input = logits (beta = sigmoid(beta)). Every load stage carries what its input means; the
// stages themselves (decay, delta correction) are the same as with plain inputs. The chunk
// pipeline's loads carry the same meanings (load_chunk l2norm, load_gate, load_beta).
// RUN: k3c opt %s -p lower-recurrent | filecheck %s
// RUN: k3c opt %s -p lower-recurrent | k3c opt - | filecheck %s
// RUN: k3c opt %s -p lower-recurrent --generic | k3c opt - | filecheck %s
// RUN: k3c opt %s -p lower-recurrent --generic | filecheck %s --check-prefix=GENERIC
// RUN: k3c opt %s -p 'lower-recurrent,derive-chunkwise{chunk-size=16},fuse-chunkwise{block-v=16}' | filecheck %s --check-prefix=CHUNK
// Each option on its own: only its load stage changes.
// RUN: sed 's/qk_l2norm = true, gate_input = softplus, beta_input = logits/qk_l2norm = true/' %s | k3c opt - -p lower-recurrent | filecheck %s --check-prefix=L2ONLY
// RUN: sed 's/qk_l2norm = true, gate_input = softplus, beta_input = logits/beta_input = logits/' %s | k3c opt - -p lower-recurrent | filecheck %s --check-prefix=BETAONLY
// Negative eigenvalues (beta = 2 sigmoid(beta), fla's allow_neg_eigval): only load_beta says so.
// RUN: sed 's/qk_l2norm = true, gate_input = softplus, beta_input = logits/beta_input = logits_neg_eigval/' %s | k3c opt - -p lower-recurrent | filecheck %s --check-prefix=NEGEIG

builtin.module {
  k3.recurrence @kda <gate = channel, delta_rule = true, num_heads = 2, num_v_heads = 4, head_k_dim = 16, head_v_dim = 32, scale = 0.25, state_layout = kv, dtype = bfloat16, qk_l2norm = true, gate_input = softplus, beta_input = logits>
}

// CHECK:      builtin.module {
// CHECK-NEXT:   k3.recurrence @kda <gate = channel, delta_rule = true, num_heads = 2, num_v_heads = 4, head_k_dim = 16, head_v_dim = 32, scale = 0.25, state_layout = kv, dtype = bfloat16, qk_l2norm = true, gate_input = softplus, beta_input = logits>
// CHECK-NEXT:   k3s.entry @recurrent <source = kda> {
// CHECK-NEXT:     %q = k3s.tensor_arg @q <role = input> : !k3s.tensor<B x T x 2 x 16, float>
// CHECK-NEXT:     %k = k3s.tensor_arg @k <role = input> : !k3s.tensor<B x T x 2 x 16, float>
// CHECK-NEXT:     %v = k3s.tensor_arg @v <role = input> : !k3s.tensor<B x T x 4 x 32, float>
// CHECK-NEXT:     %g = k3s.tensor_arg @g <role = input> : !k3s.tensor<B x T x 4 x 16, float>
// CHECK-NEXT:     %beta = k3s.tensor_arg @beta <role = input> : !k3s.tensor<B x T x 4, float>
// CHECK-NEXT:     %scale = k3s.scalar_arg @scale <default = 0.25> : f32
// CHECK-NEXT:     %initial_state = k3s.tensor_arg @initial_state <role = optional_input> : !k3s.tensor<N x 4 x 16 x 32, float32>
// CHECK-NEXT:     %o = k3s.tensor_arg @o <role = output> : !k3s.tensor<B x T x 4 x 32, float>
// CHECK-NEXT:     %final_state = k3s.tensor_arg @final_state <role = optional_output> : !k3s.tensor<N x 4 x 16 x 32, float32>
// CHECK-NEXT:     %cu_seqlens = k3s.tensor_arg @cu_seqlens <role = optional_input> : !k3s.tensor<N+1, offsets>
// CHECK-NEXT:     %A_log = k3s.tensor_arg @A_log <role = input> : !k3s.tensor<4, float>
// CHECK-NEXT:     %dt_bias = k3s.tensor_arg @dt_bias <role = input> : !k3s.tensor<64, float>
// CHECK-NEXT:     k3s.kernel @kda_recurrent <grid = "value_block,sequence_head", num_warps = 4> {
// CHECK-NEXT:       k3s.state_tile <head_k_dim = 16, head_v_dim = 32, block_v = 32, layout = kv>
// CHECK-NEXT:       k3s.token_loop {
// CHECK-NEXT:       ^bb0(%S: !k3s.tile<K x V>):
// CHECK-NEXT:         %q = k3s.load_token <tensor = q, l2norm = true> : !k3s.tile<K>
// CHECK-NEXT:         %k = k3s.load_token <tensor = k, l2norm = true> : !k3s.tile<K>
// CHECK-NEXT:         %v = k3s.load_token <tensor = v> : !k3s.tile<V>
// CHECK-NEXT:         %g = k3s.load_gate <gate = channel, input = softplus, lower_bound = -5.0> : !k3s.tile<K>
// CHECK-NEXT:         %S_1 = k3s.decay %S, %g <gate = channel> : !k3s.tile<K x V>
// CHECK-NEXT:         %beta = k3s.load_beta <input = logits> : !k3s.tile<>
// CHECK-NEXT:         %u = k3s.delta_correct %S_1, %k, %v, %beta : !k3s.tile<V>
// CHECK-NEXT:         %S_2 = k3s.rank1_update %S_1, %k, %u : !k3s.tile<K x V>
// CHECK-NEXT:         %o = k3s.readout %S_2, %q : !k3s.tile<V>
// CHECK-NEXT:         k3s.next_token %S_2
// CHECK-NEXT:       }
// CHECK-NEXT:       k3s.store_state <layout = kv>
// CHECK-NEXT:     }
// CHECK-NEXT:   }
// CHECK-NEXT: }

// GENERIC:      "k3.recurrence"() <{sym_name = "kda", {{.*}}, dtype = #k3<dtype bfloat16>, qk_l2norm = true, gate_input = #k3<gate_input softplus>, beta_input = #k3<beta_input logits>}> : () -> ()
// GENERIC:      "k3s.tensor_arg"() <{sym_name = "A_log", type = !k3s.tensor<4, float>, role = #k3s<arg_role input>}> : () -> ()
// GENERIC-NEXT: "k3s.tensor_arg"() <{sym_name = "dt_bias", type = !k3s.tensor<64, float>, role = #k3s<arg_role input>}> : () -> ()
// GENERIC:      %q = "k3s.load_token"() <{tensor = #k3s<token_tensor q>, l2norm = true}> : () -> !k3s.tile<K>
// GENERIC-NEXT: %k = "k3s.load_token"() <{tensor = #k3s<token_tensor k>, l2norm = true}> : () -> !k3s.tile<K>
// GENERIC-NEXT: %v = "k3s.load_token"() <{tensor = #k3s<token_tensor v>}> : () -> !k3s.tile<V>
// GENERIC-NEXT: %g = "k3s.load_gate"() <{gate = #k3<gate channel>, input = #k3<gate_input softplus>, lower_bound = -5.000000e+00 : f64}> : () -> !k3s.tile<K>
// GENERIC-NEXT: %S_1 = "k3s.decay"(%S, %g) <{gate = #k3<gate channel>}> : (!k3s.tile<K x V>, !k3s.tile<K>) -> !k3s.tile<K x V>
// GENERIC-NEXT: %beta = "k3s.load_beta"() <{input = #k3<beta_input logits>}> : () -> !k3s.tile<>
// GENERIC-NEXT: %u = "k3s.delta_correct"(%S_1, %k, %v, %beta) : (!k3s.tile<K x V>, !k3s.tile<K>, !k3s.tile<V>, !k3s.tile<>) -> !k3s.tile<V>

// Both entries take the gate's parameters as inputs; every load of q and k in the chunk kernels
// normalises, v's never does, and every gate and beta load has the layer's input form.
// CHUNK:       k3s.entry @chunk <source = kda> {
// CHUNK:         %A_log = k3s.tensor_arg @A_log <role = input> : !k3s.tensor<4, float>
// CHUNK-NEXT:    %dt_bias = k3s.tensor_arg @dt_bias <role = input> : !k3s.tensor<64, float>
// CHUNK:         k3s.kernel @kda_chunk_prepare
// CHUNK-NOT:     k3s.load_chunk <tensor = {{[qk]}}>
// CHUNK-NOT:     k3s.load_chunk <tensor = v, l2norm
// CHUNK-NOT:     input = log,
// CHUNK-NOT:     input = probability
// CHUNK:         k3s.load_gate <gate = channel, input = softplus, lower_bound = -5.0>
// CHUNK-NOT:     k3s.load_chunk <tensor = {{[qk]}}>
// CHUNK:         k3s.load_chunk <tensor = k, l2norm = true>
// CHUNK:         k3s.load_beta <input = logits>
// CHUNK:         k3s.load_chunk <tensor = q, l2norm = true>
// CHUNK:         k3s.load_chunk <tensor = v>
// The scan reads the decayed queries and keys the prepare kernel spilled: no input loads.
// CHUNK:         k3s.kernel @kda_chunk_scan
// CHUNK-NOT:     k3s.load_chunk
// CHUNK-NOT:     k3s.load_gate
// CHUNK:         k3s.store_state

// L2ONLY:      %A_log = k3s.tensor_arg @A_log <role = forbidden> : !k3s.tensor<4, float>
// L2ONLY-NEXT: %dt_bias = k3s.tensor_arg @dt_bias <role = forbidden> : !k3s.tensor<64, float>
// L2ONLY:      %q = k3s.load_token <tensor = q, l2norm = true> : !k3s.tile<K>
// L2ONLY-NEXT: %k = k3s.load_token <tensor = k, l2norm = true> : !k3s.tile<K>
// L2ONLY-NEXT: %v = k3s.load_token <tensor = v> : !k3s.tile<V>
// L2ONLY-NEXT: %g = k3s.load_gate <gate = channel, input = log, lower_bound = -5.0> : !k3s.tile<K>
// L2ONLY-NEXT: %S_1 = k3s.decay %S, %g <gate = channel> : !k3s.tile<K x V>
// L2ONLY-NEXT: %beta = k3s.load_beta <input = probability> : !k3s.tile<>

// BETAONLY:      %A_log = k3s.tensor_arg @A_log <role = forbidden> : !k3s.tensor<4, float>
// BETAONLY-NEXT: %dt_bias = k3s.tensor_arg @dt_bias <role = forbidden> : !k3s.tensor<64, float>
// BETAONLY:      %q = k3s.load_token <tensor = q> : !k3s.tile<K>
// BETAONLY-NEXT: %k = k3s.load_token <tensor = k> : !k3s.tile<K>
// BETAONLY-NEXT: %v = k3s.load_token <tensor = v> : !k3s.tile<V>
// BETAONLY-NEXT: %g = k3s.load_gate <gate = channel, input = log, lower_bound = -5.0> : !k3s.tile<K>
// BETAONLY-NEXT: %S_1 = k3s.decay %S, %g <gate = channel> : !k3s.tile<K x V>
// BETAONLY-NEXT: %beta = k3s.load_beta <input = logits> : !k3s.tile<>
// BETAONLY-NEXT: %u = k3s.delta_correct %S_1, %k, %v, %beta : !k3s.tile<V>

// NEGEIG:      %g = k3s.load_gate <gate = channel, input = log, lower_bound = -5.0> : !k3s.tile<K>
// NEGEIG-NEXT: %S_1 = k3s.decay %S, %g <gate = channel> : !k3s.tile<K x V>
// NEGEIG-NEXT: %beta = k3s.load_beta <input = logits_neg_eigval> : !k3s.tile<>
// NEGEIG-NEXT: %u = k3s.delta_correct %S_1, %k, %v, %beta : !k3s.tile<V>
