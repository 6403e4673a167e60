// Two recurrence layers in one module: each gets its own entry, named <layer>_recurrent so the
// module-level symbols stay distinct (a regression test: both used to be `@recurrent`, and
// verification failed with "Redefinition of symbol"), each with its own member's stages.
// RUN: k3c opt %s -p lower-recurrent | filecheck %s
// RUN: k3c opt %s -p lower-recurrent | k3c opt - | filecheck %s

builtin.module {
  k3.recurrence @first <gate = channel, delta_rule = true, num_heads = 2, num_v_heads = 2, head_k_dim = 16, head_v_dim = 16, scale = 0.25, state_layout = kv, dtype = float32>
  k3.recurrence @second <gate = none, delta_rule = false, num_heads = 2, num_v_heads = 2, head_k_dim = 16, head_v_dim = 16, scale = 0.25, state_layout = kv, dtype = float32>
}

// CHECK:      k3.recurrence @first
// CHECK-NEXT: k3s.entry @first_recurrent <source = first> {
// CHECK:      %g = k3s.load_gate <gate = channel, input = log, lower_bound = -5.0> : !k3s.tile<K>
// CHECK-NEXT: %S_1 = k3s.decay %S, %g <gate = channel> : !k3s.tile<K x V>
// CHECK-NEXT: %beta = k3s.load_beta <input = probability> : !k3s.tile<>
// CHECK-NEXT: %u = k3s.delta_correct %S_1, %k, %v, %beta : !k3s.tile<V>
// CHECK:      k3.recurrence @second
// CHECK-NEXT: k3s.entry @second_recurrent <source = second> {
// CHECK-NOT:  k3s.load_gate
// CHECK-NOT:  k3s.decay
// CHECK-NOT:  k3s.load_beta
// CHECK-NOT:  k3s.delta_correct
// CHECK:      k3s.token_loop {
// CHECK-NEXT: ^bb0(%S: !k3s.tile<K x V>):
// CHECK-NEXT:   %q = k3s.load_token <tensor = q> : !k3s.tile<K>
// CHECK-NEXT:   %k = k3s.load_token <tensor = k> : !k3s.tile<K>
// CHECK-NEXT:   %v = k3s.load_token <tensor = v> : !k3s.tile<V>
// CHECK-NEXT:   %S_1 = k3s.rank1_update %S, %k, %v : !k3s.tile<K x V>
// CHECK-NEXT:   %o = k3s.readout %S_1, %q : !k3s.tile<V>
// CHECK-NEXT:   k3s.next_token %S_1
// CHECK-NEXT: }
// CHECK-NOT:  k3s.entry
