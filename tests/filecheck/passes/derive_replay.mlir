// derive-replay: the speculative schedule follows from the op. The verify loop is the recurrent
// token stages plus a cache of (k, gate, u) written after the delta rule's correction; the
// replay carries the gate's granularity, and no gate means no decay at all.
// RUN: k3c opt %s -p 'derive-replay{draft-tokens=4}' | filecheck %s
// RUN: k3c opt %s -p 'derive-replay{draft-tokens=4}' | k3c opt - | filecheck %s

builtin.module {
  k3.recurrence @kda <gate = channel, delta_rule = true, num_heads = 2, num_v_heads = 2, head_k_dim = 8, head_v_dim = 8, scale = 0.5, state_layout = kv, dtype = float32>
  k3.recurrence @dn <gate = none, delta_rule = true, num_heads = 2, num_v_heads = 2, head_k_dim = 8, head_v_dim = 8, scale = 0.5, state_layout = kv, dtype = float32>
}

// CHECK: k3s.entry @kda_speculative <source = kda>
// CHECK: k3s.speculative <draft_tokens = 4> {
// CHECK-NEXT: k3s.token_loop {
// CHECK: k3s.decay <gate = channel>
// CHECK: k3s.delta_correct
// CHECK-NEXT: k3s.rank1_update
// CHECK-NEXT: k3s.readout
// CHECK-NEXT: k3s.cache_update
// CHECK-NEXT: }
// CHECK-NEXT: k3s.replay <gate = channel>
// CHECK: k3s.entry @dn_speculative <source = dn>
// CHECK: k3s.token_loop {
// CHECK-NOT: k3s.decay
// CHECK: k3s.cache_update
// CHECK-NEXT: }
// CHECK-NEXT: k3s.replay <gate = none>
