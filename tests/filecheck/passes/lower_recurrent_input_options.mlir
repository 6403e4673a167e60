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
// CHECK-NEXT:   k3s.entry @recurrent <source = @kda> {
// CHECK-NEXT:     %q = k3s.tensor_arg @q <role = input> : !k3s.tensor<B x T x 2 x 16, float>
// CHECK-NEXT:     %k = k3s.tensor_arg @k <role = input> : !k3s.tensor<B x T x 2 x 16, float>
// CHECK-NEXT:     %v = k3s.tensor_arg @v <role = input> : !k3s.tensor<B x T x 4 x 32, float>
// CHECK-NEXT:     %g = k3s.tensor_arg @g <role = input> : !k3s.tensor<B x T x 4 x 16, float>
// CHECK-NEXT:     %beta = k3s.tensor_arg @beta <role = input> : !k3s.tensor<B x T x 4, float>
// CHECK-NEXT:     %scale = k3s.scalar_arg @scale <default = 0.25> : f32
// CHECK-NEXT:     %initial_state = k3s.tensor_arg @initial_state <role = optional_input> : !k3s.tensor<N x 4 x 16 x 32, float32>
// CHECK-NEXT:     %o = k3s.tensor_arg @o <role = output> : !k3s.tensor<B x T x 4 x 32, float>
// CHECK-NEXT:     %final_state = k3s.tensor_arg @final_state <role = optional_output> : !k3s.tensor<N x 4 x 16 x 32, float32>
// CHECK-NEXT:     %cu_seqlens = k3s.tensor_arg @cu_seqlens <role = optional_input, purpose = sequence_offsets> : !k3s.tensor<N+1, offsets>
// CHECK-NEXT:     %A_log = k3s.tensor_arg @A_log <role = input> : !k3s.tensor<4, float>
// CHECK-NEXT:     %dt_bias = k3s.tensor_arg @dt_bias <role = input> : !k3s.tensor<64, float>
// CHECK-NEXT:     k3s.kernel @kda_recurrent <grid = [value_block, sequence_head], num_warps = 4> {
// CHECK-NEXT:       %S = k3s.state_tile %initial_state <head_k_dim = 16, head_v_dim = 32, block_v = 32, layout = kv> : !k3s.tile<K x V>
// CHECK-NEXT:       %S_final = k3s.token_loop %S, %cu_seqlens {
// CHECK-NEXT:       ^bb0(%S_1: !k3s.tile<K x V>):
// CHECK-NEXT:         %[[q:[a-z_0-9]+]] = k3s.load_token %q <l2norm = true> : !k3s.tile<K>
// CHECK-NEXT:         %[[k:[a-z_0-9]+]] = k3s.load_token %k <l2norm = true> : !k3s.tile<K>
// CHECK-NEXT:         %[[v:[a-z_0-9]+]] = k3s.load_token %v : !k3s.tile<V>
// CHECK-NEXT:         %[[g:[a-z_0-9]+]] = k3s.load_gate %g, %A_log, %dt_bias <gate = channel, input = softplus, lower_bound = -5.0, floor = -110.0> : !k3s.tile<K>
// CHECK-NEXT:         %S_2 = k3s.decay %S_1, %[[g]] <gate = channel> : !k3s.tile<K x V>
// CHECK-NEXT:         %[[beta:[a-z_0-9]+]] = k3s.load_beta %beta <input = logits> : !k3s.tile<>
// CHECK-NEXT:         %u = k3s.delta_correct %S_2, %[[k]], %[[v]], %[[beta]] : !k3s.tile<V>
// CHECK-NEXT:         %S_3 = k3s.rank1_update %S_2, %[[k]], %u : !k3s.tile<K x V>
// CHECK-NEXT:         %{{[a-z_0-9]+}} = k3s.readout %S_3, %[[q]], %o, %scale : !k3s.tile<V>
// CHECK-NEXT:         k3s.next_token %S_3
// CHECK-NEXT:       } : !k3s.tile<K x V>
// CHECK-NEXT:       k3s.store_state %S_final, %final_state <layout = kv>
// CHECK-NEXT:     }
// CHECK-NEXT:   }
// CHECK-NEXT: }

// GENERIC:      "k3.recurrence"() <{sym_name = "kda", {{.*}}, dtype = #k3<dtype bfloat16>, qk_l2norm = true, gate_input = #k3<gate_input softplus>, beta_input = #k3<beta_input logits>}> : () -> ()
// GENERIC:      %A_log = "k3s.tensor_arg"() <{sym_name = "A_log", role = #k3s<arg_role input>}> : () -> !k3s.tensor<4, float>
// GENERIC-NEXT: %dt_bias = "k3s.tensor_arg"() <{sym_name = "dt_bias", role = #k3s<arg_role input>}> : () -> !k3s.tensor<64, float>
// GENERIC:      %[[q:[a-z_0-9]+]] = "k3s.load_token"(%q) <{l2norm = true}> : (!k3s.tensor<B x T x 2 x 16, float>) -> !k3s.tile<K>
// GENERIC-NEXT: %[[k:[a-z_0-9]+]] = "k3s.load_token"(%k) <{l2norm = true}> : (!k3s.tensor<B x T x 2 x 16, float>) -> !k3s.tile<K>
// GENERIC-NEXT: %[[v:[a-z_0-9]+]] = "k3s.load_token"(%v) : (!k3s.tensor<B x T x 4 x 32, float>) -> !k3s.tile<V>
// GENERIC-NEXT: %[[g:[a-z_0-9]+]] = "k3s.load_gate"(%g, %A_log, %dt_bias) <{gate = #k3<gate channel>, input = #k3<gate_input softplus>, lower_bound = -5.000000e+00 : f64, floor = -1.100000e+02 : f64}> : (!k3s.tensor<B x T x 4 x 16, float>, !k3s.tensor<4, float>, !k3s.tensor<64, float>) -> !k3s.tile<K>
// GENERIC-NEXT: %S_2 = "k3s.decay"(%S_1, %[[g]]) <{gate = #k3<gate channel>}> : (!k3s.tile<K x V>, !k3s.tile<K>) -> !k3s.tile<K x V>
// GENERIC-NEXT: %[[beta:[a-z_0-9]+]] = "k3s.load_beta"(%beta) <{input = #k3<beta_input logits>}> : (!k3s.tensor<B x T x 4, float>) -> !k3s.tile<>
// GENERIC-NEXT: %u = "k3s.delta_correct"(%S_2, %[[k]], %[[v]], %[[beta]]) : (!k3s.tile<K x V>, !k3s.tile<K>, !k3s.tile<V>, !k3s.tile<>) -> !k3s.tile<V>

// Both entries take the gate's parameters as inputs; every load of q and k in the chunk kernels
// normalises, v's never does, and every gate and beta load has the layer's input form. The
// Grams' elementwise diagonals reload key rows and gates as those loads read them: from k, g,
// A_log and dt_bias.
// CHUNK:       k3s.entry @chunk <source = @kda> {
// CHUNK-NEXT:    %[[Q:[A-Za-z_0-9]+]] = k3s.tensor_arg @q
// CHUNK-NEXT:    %[[K:[A-Za-z_0-9]+]] = k3s.tensor_arg @k
// CHUNK-NEXT:    %[[V:[A-Za-z_0-9]+]] = k3s.tensor_arg @v
// CHUNK-NEXT:    %[[G:[A-Za-z_0-9]+]] = k3s.tensor_arg @g
// CHUNK-NEXT:    %[[BETA:[A-Za-z_0-9]+]] = k3s.tensor_arg @beta
// CHUNK:         %[[ALOG:[A-Za-z_0-9]+]] = k3s.tensor_arg @A_log <role = input> : !k3s.tensor<4, float>
// CHUNK-NEXT:    %[[DTBIAS:[A-Za-z_0-9]+]] = k3s.tensor_arg @dt_bias <role = input> : !k3s.tensor<64, float>
// CHUNK:         k3s.kernel @kda_chunk_prepare
// CHUNK-NOT:     k3s.load_chunk %[[Q]] :
// CHUNK-NOT:     k3s.load_chunk %[[K]] :
// CHUNK-NOT:     k3s.load_chunk %[[V]] <l2norm
// CHUNK-NOT:     input = log,
// CHUNK-NOT:     input = probability
// CHUNK:         k3s.load_gate %[[G]], %[[ALOG]], %[[DTBIAS]] <gate = channel, input = softplus, lower_bound = -5.0, floor = -110.0>
// CHUNK-NOT:     k3s.load_chunk %[[Q]] :
// CHUNK-NOT:     k3s.load_chunk %[[K]] :
// CHUNK:         k3s.load_chunk %[[K]] <l2norm = true>
// CHUNK:         k3s.load_beta %[[BETA]] <input = logits>
// CHUNK-NEXT:    k3s.gram {{.*}}, %[[K]], %[[G]], %[[ALOG]], %[[DTBIAS]] <mask = strict, gate = channel, beta = true, diagonal = guarded>
// CHUNK:         k3s.load_chunk %[[Q]] <l2norm = true>
// CHUNK:         k3s.gram {{.*}}, %[[K]], %[[G]], %[[ALOG]], %[[DTBIAS]] <mask = inclusive, gate = channel, beta = false, diagonal = guarded>
// CHUNK:         k3s.load_chunk %[[V]] :
// The scan reads the decayed queries and keys the prepare kernel spilled: no input loads.
// CHUNK:         k3s.kernel @kda_chunk_scan
// CHUNK-NOT:     k3s.load_chunk
// CHUNK-NOT:     k3s.load_gate
// CHUNK:         k3s.store_state

// L2ONLY:      %A_log = k3s.tensor_arg @A_log <role = forbidden> : !k3s.tensor<4, float>
// L2ONLY-NEXT: %dt_bias = k3s.tensor_arg @dt_bias <role = forbidden> : !k3s.tensor<64, float>
// L2ONLY:      %[[q:[a-z_0-9]+]] = k3s.load_token %q <l2norm = true> : !k3s.tile<K>
// L2ONLY-NEXT: %[[k:[a-z_0-9]+]] = k3s.load_token %k <l2norm = true> : !k3s.tile<K>
// L2ONLY-NEXT: %[[v:[a-z_0-9]+]] = k3s.load_token %v : !k3s.tile<V>
// L2ONLY-NEXT: %[[g:[a-z_0-9]+]] = k3s.load_gate %g <gate = channel, input = log, lower_bound = -5.0, floor = -110.0> : !k3s.tile<K>
// L2ONLY-NEXT: %S_2 = k3s.decay %S_1, %[[g]] <gate = channel> : !k3s.tile<K x V>
// L2ONLY-NEXT: %[[beta:[a-z_0-9]+]] = k3s.load_beta %beta <input = probability> : !k3s.tile<>

// BETAONLY:      %A_log = k3s.tensor_arg @A_log <role = forbidden> : !k3s.tensor<4, float>
// BETAONLY-NEXT: %dt_bias = k3s.tensor_arg @dt_bias <role = forbidden> : !k3s.tensor<64, float>
// BETAONLY:      %[[q:[a-z_0-9]+]] = k3s.load_token %q : !k3s.tile<K>
// BETAONLY-NEXT: %[[k:[a-z_0-9]+]] = k3s.load_token %k : !k3s.tile<K>
// BETAONLY-NEXT: %[[v:[a-z_0-9]+]] = k3s.load_token %v : !k3s.tile<V>
// BETAONLY-NEXT: %[[g:[a-z_0-9]+]] = k3s.load_gate %g <gate = channel, input = log, lower_bound = -5.0, floor = -110.0> : !k3s.tile<K>
// BETAONLY-NEXT: %S_2 = k3s.decay %S_1, %[[g]] <gate = channel> : !k3s.tile<K x V>
// BETAONLY-NEXT: %[[beta:[a-z_0-9]+]] = k3s.load_beta %beta <input = logits> : !k3s.tile<>
// BETAONLY-NEXT: %u = k3s.delta_correct %S_2, %[[k]], %[[v]], %[[beta]] : !k3s.tile<V>

// NEGEIG:      %[[k:[a-z_0-9]+]] = k3s.load_token %k : !k3s.tile<K>
// NEGEIG-NEXT: %[[v:[a-z_0-9]+]] = k3s.load_token %v : !k3s.tile<V>
// NEGEIG-NEXT: %[[g:[a-z_0-9]+]] = k3s.load_gate %g <gate = channel, input = log, lower_bound = -5.0, floor = -110.0> : !k3s.tile<K>
// NEGEIG-NEXT: %S_2 = k3s.decay %S_1, %[[g]] <gate = channel> : !k3s.tile<K x V>
// NEGEIG-NEXT: %[[beta:[a-z_0-9]+]] = k3s.load_beta %beta <input = logits_neg_eigval> : !k3s.tile<>
// NEGEIG-NEXT: %u = k3s.delta_correct %S_2, %[[k]], %[[v]], %[[beta]] : !k3s.tile<V>
