// Names that spell true/false re-parse as names, not booleans: a layer named `true` (a valid
// spec name) is the symbol reference `source = @true` of its entry. A regression test: as a
// plain string, `source = true` used to re-parse as a bool and fail verification (string values
// that spell true/false are quoted: `source = "true"`).
// RUN: k3c opt %s -p lower-recurrent | filecheck %s
// RUN: k3c opt %s -p lower-recurrent | k3c opt - | filecheck %s
// RUN: k3c opt %s -p lower-recurrent --generic | k3c opt - | filecheck %s

builtin.module {
  k3.recurrence @true <gate = channel, delta_rule = true, num_heads = 2, num_v_heads = 2, head_k_dim = 16, head_v_dim = 16, scale = 0.25, state_layout = kv, dtype = float32>
}

// CHECK:      k3.recurrence @true <gate = channel, delta_rule = true,
// CHECK-NEXT: k3s.entry @recurrent <source = @true> {
// CHECK:      k3s.kernel @true_recurrent
