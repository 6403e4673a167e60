// num_v_heads must be a multiple of num_heads (value head h reads query/key head
// h // (num_v_heads / num_heads)): 6 value heads over 4 query heads is rejected.
// RUN: not k3c opt %s 2>&1 | filecheck %s --check-prefix=ERR

builtin.module {
  k3.recurrence @r <gate = channel, delta_rule = true, num_heads = 4, num_v_heads = 6, head_k_dim = 64, head_v_dim = 64, scale = 0.125, state_layout = kv, dtype = float32>
}

// ERR-NOT: {{\n}}
// ERR: {{^}}k3c opt: error: {{.*}}num_v_heads_multiple.mlir: k3.recurrence @r: num_v_heads (6) must be a multiple of num_heads (4){{$}}
// ERR-NOT: {{.}}
