// A k3.recurrence gate outside channel/scalar/none is rejected by the parser, naming the op,
// the property, the allowed values and the bad value.
// RUN: not k3c opt %s 2>&1 | filecheck %s --check-prefix=ERR
// One line only: nothing before it (no newline precedes the match), nothing after it.

builtin.module {
  k3.recurrence @r <gate = diagonal, delta_rule = true, num_heads = 4, num_v_heads = 4, head_k_dim = 64, head_v_dim = 64, scale = 0.125, state_layout = kv, dtype = float32>
}

// ERR-NOT: {{\n}}
// ERR: {{^}}k3c opt: error: {{.*}}bad_gate.mlir:{{[0-9]+}}:{{[0-9]+}}: k3.recurrence: property 'gate' must be one of channel, scalar, none; got diagonal{{$}}
// ERR-NOT: {{.}}
