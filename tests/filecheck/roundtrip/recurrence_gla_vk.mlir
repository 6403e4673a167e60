// k3.recurrence, GLA member (channel gate, no delta rule) with a vk state layout, float32 and
// a round scale (1.0 must keep its '.' in the custom form so it re-parses as a float).
// RUN: k3c opt %s | filecheck %s --match-full-lines
// RUN: k3c opt %s --generic | k3c opt - | filecheck %s --match-full-lines
// RUN: k3c opt %s --generic | filecheck %s --check-prefix=GENERIC
// RUN: k3c opt %s > %t.once && k3c opt %t.once > %t.twice && diff %t.once %t.twice

builtin.module {
  k3.recurrence @gla <gate = channel, delta_rule = false, num_heads = 4, num_v_heads = 4, head_k_dim = 64, head_v_dim = 32, scale = 1.0, state_layout = vk, dtype = float32>
}

// CHECK:      builtin.module {
// CHECK-NEXT:   k3.recurrence @gla <gate = channel, delta_rule = false, num_heads = 4, num_v_heads = 4, head_k_dim = 64, head_v_dim = 32, scale = 1.0, state_layout = vk, dtype = float32>
// CHECK-NEXT: }

// GENERIC:      "builtin.module"() ({
// GENERIC-NEXT:   "k3.recurrence"() <{sym_name = "gla", gate = #k3<gate channel>, delta_rule = false, num_heads = 4 : i64, num_v_heads = 4 : i64, head_k_dim = 64 : i64, head_v_dim = 32 : i64, scale = 1.000000e+00 : f64, state_layout = #k3<state_layout vk>, dtype = #k3<dtype float32>}> : () -> ()
// GENERIC-NEXT: }) : () -> ()
