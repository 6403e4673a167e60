// A float property written as an integer (`scale = 1`, natural to type) reads as that float;
// a value that does not fit its property's declared kind is a parse error naming the op and the
// property (`delta_rule = 1`: true or false only; `eps = 1e-06`: MLIR floats need a '.').
// RUN: sh -c 'k3c opt "$1" 2>&1; true' sh %s | filecheck %s
// RUN: sed 's/delta_rule = true/delta_rule = 1/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=BOOL
// RUN: sed 's/scale = 1,/scale = 1e-06,/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=EXP

builtin.module {
  k3.recurrence @r <gate = channel, delta_rule = true, num_heads = 4, num_v_heads = 4, head_k_dim = 64, head_v_dim = 64, scale = 1, state_layout = kv, dtype = float32>
}

// CHECK: {{scale = 1.0|k3c opt: error: .*scale}}

// BOOL-NOT: {{\n}}
// BOOL: {{^}}k3c opt: error: <stdin>:{{[0-9]+}}:{{[0-9]+}}: k3.recurrence: property 'delta_rule' expects true or false, got 1{{$}}
// BOOL-NOT: {{.}}

// EXP-NOT: {{\n}}
// EXP: {{^}}k3c opt: error: <stdin>:{{[0-9]+}}:{{[0-9]+}}: float literals need a '.': write 1.0e-06{{$}}
// EXP-NOT: {{.}}
