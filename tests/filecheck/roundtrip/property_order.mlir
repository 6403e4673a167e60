// Properties print in the op's declaration order, whatever order they were written in (here
// dtype first), so the same op always prints one way. (A repeated key is a parse error:
// verify/duplicate_property.mlir.)
// RUN: k3c opt %s | filecheck %s --match-full-lines

builtin.module {
  k3.recurrence @r <dtype = float32, state_layout = kv, scale = 0.125, head_v_dim = 32, head_k_dim = 64, num_v_heads = 4, num_heads = 4, delta_rule = true, gate = channel>
}

// CHECK:      builtin.module {
// CHECK-NEXT:   k3.recurrence @r <gate = channel, delta_rule = true, num_heads = 4, num_v_heads = 4, head_k_dim = 64, head_v_dim = 32, scale = 0.125, state_layout = kv, dtype = float32>
// CHECK-NEXT: }
