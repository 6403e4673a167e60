// KNOWN BUG (XFAIL): string values are printed bare when they look like identifiers, so a
// layer named `true` or `false` (a valid spec name: it is a Python identifier) gets
// `source = true` in its entry, which re-parses as a boolean and fails verification
// ("true should be of base attribute string"). `k3c ir --after-all --generic` on such a spec
// re-parses and crashes the same way. Strings equal to true/false must be quoted.
// Remove XFAIL once fixed.
// XFAIL: *
// RUN: k3c opt %s -p lower-recurrent | k3c opt - | filecheck %s

builtin.module {
  k3.recurrence @true <gate = channel, delta_rule = true, num_heads = 2, num_v_heads = 2, head_k_dim = 16, head_v_dim = 16, scale = 0.25, state_layout = kv, dtype = float32>
}

// CHECK: k3s.entry @recurrent <source = {{"?}}true{{"?}}> {
