// KNOWN BUG (XFAIL): a property written twice is accepted silently and the last value wins
// (ir/syntax.py KeywordSyntax.parse stores into a dict), so `gate = bogus, gate = channel`
// verifies as a channel gate. It should be a parse error naming the repeated key.
// Remove XFAIL once fixed.
// XFAIL: *
// RUN: not k3c opt %s 2>&1 | filecheck %s --check-prefix=ERR

builtin.module {
  k3.recurrence @r <gate = bogus, gate = channel, delta_rule = true, num_heads = 4, num_v_heads = 4, head_k_dim = 64, head_v_dim = 64, scale = 0.125, state_layout = kv, dtype = float32>
}

// ERR-NOT: {{\n}}
// ERR: {{^}}k3c opt: error: {{.*}}duplicate_property.mlir:{{.*}}gate{{.*}}{{$}}
// ERR-NOT: {{.}}
