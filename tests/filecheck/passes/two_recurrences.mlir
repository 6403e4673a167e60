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
// CHECK-NEXT: k3s.entry @first_recurrent <source = @first> {
// CHECK:      %[[K1:[A-Za-z_0-9]+]] = k3s.tensor_arg @k
// CHECK:      %[[G1:[A-Za-z_0-9]+]] = k3s.tensor_arg @g
// CHECK:      %[[k1:[a-z_0-9]+]] = k3s.load_token %[[K1]] : !k3s.tile<K>
// CHECK-NEXT: %[[v1:[a-z_0-9]+]] = k3s.load_token
// CHECK-NEXT: %[[g1:[a-z_0-9]+]] = k3s.load_gate %[[G1]] <gate = channel, input = log, lower_bound = -5.0, floor = -110.0> : !k3s.tile<K>
// CHECK-NEXT: %S_2 = k3s.decay %S_1, %[[g1]] <gate = channel> : !k3s.tile<K x V>
// CHECK-NEXT: %[[beta1:[a-z_0-9]+]] = k3s.load_beta
// CHECK-NEXT: %u = k3s.delta_correct %S_2, %[[k1]], %[[v1]], %[[beta1]] : !k3s.tile<V>
// CHECK:      k3.recurrence @second
// CHECK-NEXT: k3s.entry @second_recurrent <source = @second> {
// each entry's stages read its own arguments
// CHECK-NEXT:   %[[Q2:[A-Za-z_0-9]+]] = k3s.tensor_arg @q
// CHECK-NEXT:   %[[K2:[A-Za-z_0-9]+]] = k3s.tensor_arg @k
// CHECK-NEXT:   %[[V2:[A-Za-z_0-9]+]] = k3s.tensor_arg @v
// CHECK-NOT:  k3s.load_gate
// CHECK-NOT:  k3s.decay
// CHECK-NOT:  k3s.load_beta
// CHECK-NOT:  k3s.delta_correct
// CHECK:      %S_final = k3s.token_loop %S, %{{[A-Za-z_0-9]+}} {
// CHECK-NEXT: ^bb0(%[[S:[A-Za-z_0-9]+]]: !k3s.tile<K x V>):
// CHECK-NEXT:   %[[q2:[a-z_0-9]+]] = k3s.load_token %[[Q2]] : !k3s.tile<K>
// CHECK-NEXT:   %[[k2:[a-z_0-9]+]] = k3s.load_token %[[K2]] : !k3s.tile<K>
// CHECK-NEXT:   %[[v2:[a-z_0-9]+]] = k3s.load_token %[[V2]] : !k3s.tile<V>
// CHECK-NEXT:   %[[S1:[A-Za-z_0-9]+]] = k3s.rank1_update %[[S]], %[[k2]], %[[v2]] : !k3s.tile<K x V>
// CHECK-NEXT:   %{{[a-z_0-9]+}} = k3s.readout %[[S1]], %[[q2]], %{{[a-z_0-9]+}}, %{{[a-z_0-9]+}} : !k3s.tile<V>
// CHECK-NEXT:   k3s.next_token %[[S1]]
// CHECK-NEXT: } : !k3s.tile<K x V>
// CHECK-NOT:  k3s.entry
