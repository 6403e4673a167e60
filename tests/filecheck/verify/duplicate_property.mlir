// A property written twice is a parse error naming the repeated key (not last-one-wins, which
// would let `gate = bogus, gate = channel` verify as a channel gate).
// RUN: not k3c opt %s 2>&1 | filecheck %s --check-prefix=ERR

builtin.module {
  k3.recurrence @r <gate = bogus, gate = channel, delta_rule = true, num_heads = 4, num_v_heads = 4, head_k_dim = 64, head_v_dim = 64, scale = 0.125, state_layout = kv, dtype = float32>
}

// ERR-NOT: {{\n}}
// ERR: {{^}}k3c opt: error: {{.*}}duplicate_property.mlir:{{.*}}gate{{.*}}{{$}}
// ERR-NOT: {{.}}
