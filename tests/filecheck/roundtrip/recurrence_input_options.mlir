// k3.recurrence with its input options (qk_l2norm, gate_input, gate_lower_bound, beta_input):
// the custom form prints back unchanged with the options after dtype in declaration order
// (whatever order they were written in), the generic form carries them as optional properties
// and re-parses to the same custom form, and printing is a fixed point. An op without them
// (the defaults) prints none of them: roundtrip/recurrence_kda.mlir.
// RUN: k3c opt %s | filecheck %s --match-full-lines
// RUN: k3c opt %s --generic | k3c opt - | filecheck %s --match-full-lines
// RUN: k3c opt %s --generic | filecheck %s --check-prefix=GENERIC
// RUN: k3c opt %s > %t.once && k3c opt %t.once > %t.twice && diff %t.once %t.twice
// RUN: k3c opt %s --generic > %t.g1 && k3c opt %t.g1 --generic > %t.g2 && diff %t.g1 %t.g2

builtin.module {
  k3.recurrence @kda <gate = channel, delta_rule = true, num_heads = 2, num_v_heads = 4, head_k_dim = 16, head_v_dim = 32, scale = 0.25, state_layout = kv, dtype = bfloat16, qk_l2norm = true, gate_input = softplus, beta_input = logits>
  k3.recurrence @gdn <beta_input = logits, gate_lower_bound = -3.0, gate_input = bounded, gate = scalar, delta_rule = true, num_heads = 2, num_v_heads = 2, head_k_dim = 16, head_v_dim = 16, scale = 0.25, state_layout = vk, dtype = float32>
  k3.recurrence @gla <gate = channel, delta_rule = false, num_heads = 2, num_v_heads = 2, head_k_dim = 16, head_v_dim = 16, scale = 0.25, state_layout = kv, dtype = float16, qk_l2norm = true, gate_input = bounded, gate_lower_bound = -0.5>
}

// CHECK:      builtin.module {
// CHECK-NEXT:   k3.recurrence @kda <gate = channel, delta_rule = true, num_heads = 2, num_v_heads = 4, head_k_dim = 16, head_v_dim = 32, scale = 0.25, state_layout = kv, dtype = bfloat16, qk_l2norm = true, gate_input = softplus, beta_input = logits>
// CHECK-NEXT:   k3.recurrence @gdn <gate = scalar, delta_rule = true, num_heads = 2, num_v_heads = 2, head_k_dim = 16, head_v_dim = 16, scale = 0.25, state_layout = vk, dtype = float32, gate_input = bounded, gate_lower_bound = -3.0, beta_input = logits>
// CHECK-NEXT:   k3.recurrence @gla <gate = channel, delta_rule = false, num_heads = 2, num_v_heads = 2, head_k_dim = 16, head_v_dim = 16, scale = 0.25, state_layout = kv, dtype = float16, qk_l2norm = true, gate_input = bounded, gate_lower_bound = -0.5>
// CHECK-NEXT: }

// GENERIC:      "builtin.module"() ({
// GENERIC-NEXT:   "k3.recurrence"() <{sym_name = "kda", gate = #k3<gate channel>, delta_rule = true, num_heads = 2 : i64, num_v_heads = 4 : i64, head_k_dim = 16 : i64, head_v_dim = 32 : i64, scale = 2.500000e-01 : f64, state_layout = #k3<state_layout kv>, dtype = #k3<dtype bfloat16>, qk_l2norm = true, gate_input = #k3<gate_input softplus>, beta_input = #k3<beta_input logits>}> : () -> ()
// GENERIC-NEXT:   "k3.recurrence"() <{sym_name = "gdn", gate = #k3<gate scalar>, delta_rule = true, num_heads = 2 : i64, num_v_heads = 2 : i64, head_k_dim = 16 : i64, head_v_dim = 16 : i64, scale = 2.500000e-01 : f64, state_layout = #k3<state_layout vk>, dtype = #k3<dtype float32>, gate_input = #k3<gate_input bounded>, gate_lower_bound = -3.000000e+00 : f64, beta_input = #k3<beta_input logits>}> : () -> ()
// GENERIC-NEXT:   "k3.recurrence"() <{sym_name = "gla", gate = #k3<gate channel>, delta_rule = false, num_heads = 2 : i64, num_v_heads = 2 : i64, head_k_dim = 16 : i64, head_v_dim = 16 : i64, scale = 2.500000e-01 : f64, state_layout = #k3<state_layout kv>, dtype = #k3<dtype float16>, qk_l2norm = true, gate_input = #k3<gate_input bounded>, gate_lower_bound = -5.000000e-01 : f64}> : () -> ()
// GENERIC-NEXT: }) : () -> ()
