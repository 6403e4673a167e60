// k3.recurrence, DeltaNet member (no gate, delta rule).
// RUN: k3c opt %s | filecheck %s --match-full-lines
// RUN: k3c opt %s --generic | k3c opt - | filecheck %s --match-full-lines
// RUN: k3c opt %s --generic | filecheck %s --check-prefix=GENERIC
// RUN: k3c opt %s > %t.once && k3c opt %t.once > %t.twice && diff %t.once %t.twice

builtin.module {
  k3.recurrence @deltanet <gate = none, delta_rule = true, num_heads = 16, num_v_heads = 16, head_k_dim = 128, head_v_dim = 128, scale = 0.08838834764831845, state_layout = kv, dtype = bfloat16>
}

// CHECK:      builtin.module {
// CHECK-NEXT:   k3.recurrence @deltanet <gate = none, delta_rule = true, num_heads = 16, num_v_heads = 16, head_k_dim = 128, head_v_dim = 128, scale = 0.08838834764831845, state_layout = kv, dtype = bfloat16>
// CHECK-NEXT: }

// GENERIC:      "builtin.module"() ({
// GENERIC-NEXT:   "k3.recurrence"() <{sym_name = "deltanet", gate = #k3<gate none>, delta_rule = true, num_heads = 16 : i64, num_v_heads = 16 : i64, head_k_dim = 128 : i64, head_v_dim = 128 : i64, scale = 0.088388347648318447 : f64, state_layout = #k3<state_layout kv>, dtype = #k3<dtype bfloat16>}> : () -> ()
// GENERIC-NEXT: }) : () -> ()
