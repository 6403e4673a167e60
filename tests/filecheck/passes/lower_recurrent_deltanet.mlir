// lower-recurrent on DeltaNet (no gate, delta rule): no decay stage at all, g is forbidden
// (the member has no gate input) and beta is a required input.
// RUN: k3c opt %s -p lower-recurrent | filecheck %s
// RUN: k3c opt %s -p lower-recurrent | k3c opt - | filecheck %s

builtin.module {
  k3.recurrence @deltanet <gate = none, delta_rule = true, num_heads = 4, num_v_heads = 4, head_k_dim = 64, head_v_dim = 32, scale = 0.125, state_layout = kv, dtype = bfloat16>
}

// CHECK:      k3s.entry @recurrent <source = deltanet> {
// CHECK:        k3s.tensor_arg @g <shape = "B,T,4", dtype = float, role = forbidden>
// CHECK-NEXT:   k3s.tensor_arg @beta <shape = "B,T,4", dtype = float, role = input>
// CHECK-NOT:    k3s.decay
// CHECK:        k3s.token_loop {
// CHECK-NEXT:     k3s.load_token <tensor = q>
// CHECK-NEXT:     k3s.load_token <tensor = k>
// CHECK-NEXT:     k3s.load_token <tensor = v>
// CHECK-NEXT:     k3s.delta_correct
// CHECK-NEXT:     k3s.rank1_update
// CHECK-NEXT:     k3s.readout
// CHECK-NEXT:   }
// CHECK-NOT:    k3s.decay
