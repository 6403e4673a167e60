// k3.recurrence, KDA member (channel gate, delta rule, kv state): the custom form prints back
// unchanged, the generic form re-parses to the same custom form, and printing is a fixed point.
// RUN: k3c opt %s | filecheck %s --match-full-lines
// RUN: k3c opt %s --generic | k3c opt - | filecheck %s --match-full-lines
// RUN: k3c opt %s --generic | filecheck %s --check-prefix=GENERIC
// RUN: k3c opt %s > %t.once && k3c opt %t.once > %t.twice && diff %t.once %t.twice

builtin.module {
  k3.recurrence @kda <gate = channel, delta_rule = true, num_heads = 32, num_v_heads = 32, head_k_dim = 128, head_v_dim = 128, scale = 0.08838834764831845, state_layout = kv, dtype = bfloat16>
}

// CHECK:      builtin.module {
// CHECK-NEXT:   k3.recurrence @kda <gate = channel, delta_rule = true, num_heads = 32, num_v_heads = 32, head_k_dim = 128, head_v_dim = 128, scale = 0.08838834764831845, state_layout = kv, dtype = bfloat16>
// CHECK-NEXT: }

// GENERIC:      "builtin.module"() ({
// GENERIC-NEXT:   "k3.recurrence"() <{sym_name = "kda", gate = #k3<gate channel>, delta_rule = true, num_heads = 32 : i64, num_v_heads = 32 : i64, head_k_dim = 128 : i64, head_v_dim = 128 : i64, scale = 0.088388347648318447 : f64, state_layout = #k3<state_layout kv>, dtype = #k3<dtype bfloat16>}> : () -> ()
// GENERIC-NEXT: }) : () -> ()
