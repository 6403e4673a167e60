// k3.recurrence, Gated DeltaNet member (scalar gate, delta rule) with grouped value heads
// (num_v_heads = 2 x num_heads) and K != V, in float16.
// RUN: k3c opt %s | filecheck %s --match-full-lines
// RUN: k3c opt %s --generic | k3c opt - | filecheck %s --match-full-lines
// RUN: k3c opt %s --generic | filecheck %s --check-prefix=GENERIC
// RUN: k3c opt %s > %t.once && k3c opt %t.once > %t.twice && diff %t.once %t.twice

builtin.module {
  k3.recurrence @gdn <gate = scalar, delta_rule = true, num_heads = 16, num_v_heads = 32, head_k_dim = 128, head_v_dim = 64, scale = 0.08838834764831845, state_layout = kv, dtype = float16>
}

// CHECK:      builtin.module {
// CHECK-NEXT:   k3.recurrence @gdn <gate = scalar, delta_rule = true, num_heads = 16, num_v_heads = 32, head_k_dim = 128, head_v_dim = 64, scale = 0.08838834764831845, state_layout = kv, dtype = float16>
// CHECK-NEXT: }

// GENERIC:      "builtin.module"() ({
// GENERIC-NEXT:   "k3.recurrence"() <{sym_name = "gdn", gate = #k3<gate scalar>, delta_rule = true, num_heads = 16 : i64, num_v_heads = 32 : i64, head_k_dim = 128 : i64, head_v_dim = 64 : i64, scale = 0.088388347648318447 : f64, state_layout = #k3<state_layout kv>, dtype = #k3<dtype float16>}> : () -> ()
// GENERIC-NEXT: }) : () -> ()
