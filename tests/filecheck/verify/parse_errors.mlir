// Syntax errors point at line:column of the input; unknown ops and missing properties are
// one-line errors too.
// RUN: not k3c opt %s 2>&1 | filecheck %s --check-prefix=ERR
// RUN: sed 's/k3.recurrence @r/k3.frobnicate @r/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=UNKNOWN
// RUN: sed 's/scale = 0.125 state_layout/scale = 0.125, state_layout/; s/, dtype = float32>/>/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=MISSING
// RUN: sed 's/scale = 0.125 state_layout/scale = 0.125, state_layout/; s/<gate = channel/<extra = 1, gate = channel/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=EXTRA

builtin.module {
  k3.recurrence @r <gate = channel, delta_rule = true, num_heads = 4, num_v_heads = 4, head_k_dim = 64, head_v_dim = 64, scale = 0.125 state_layout = kv, dtype = float32>
}

// ERR-NOT: {{\n}}
// ERR: {{^}}k3c opt: error: {{.*}}parse_errors.mlir:9:{{[0-9]+}}: Expected '>'{{$}}
// ERR-NOT: {{.}}

// UNKNOWN-NOT: {{\n}}
// UNKNOWN: {{^}}k3c opt: error: <stdin>:9:{{[0-9]+}}: Operation k3.frobnicate is not registered{{$}}
// UNKNOWN-NOT: {{.}}

// MISSING-NOT: {{\n}}
// MISSING: {{^}}k3c opt: error: <stdin>: property 'dtype' expected in operation 'k3.recurrence'{{$}}
// MISSING-NOT: {{.}}

// EXTRA-NOT: {{\n}}
// EXTRA: {{^}}k3c opt: error: <stdin>: property 'extra' is not defined by the operation 'k3.recurrence'{{.*}}{{$}}
// EXTRA-NOT: {{.}}
