// derive-replay: the speculative schedule follows from the op. The verify loop is the recurrent
// token stages plus a cache of (k, gate, u) written after the delta rule's correction; the
// replay carries the gate's granularity, and no gate means no decay at all. The entry declares
// the cache the verify writes and the replay reads, and the accepted counts the replay reads.
// Both start from the committed state, the speculative block's one argument.
// RUN: k3c opt %s -p 'derive-replay{draft-tokens=4}' | filecheck %s
// RUN: k3c opt %s -p 'derive-replay{draft-tokens=4}' | k3c opt - | filecheck %s
// RUN: k3c opt %s -p 'derive-replay{draft-tokens=4}' | sed 's/^    ^bb0(%%S: !k3s.tile<K x V>):$/    ^bb0(%%S: !k3s.tile<K x V>, %%X: !k3s.tile<K>):/' | not k3c opt - 2>&1 | filecheck %s --check-prefix=ONEARG

builtin.module {
  k3.recurrence @kda <gate = channel, delta_rule = true, num_heads = 2, num_v_heads = 2, head_k_dim = 8, head_v_dim = 8, scale = 0.5, state_layout = kv, dtype = float32>
  k3.recurrence @dn <gate = none, delta_rule = true, num_heads = 2, num_v_heads = 2, head_k_dim = 8, head_v_dim = 8, scale = 0.5, state_layout = kv, dtype = float32>
}

// CHECK: k3s.entry @kda_speculative <source = @kda>
// CHECK: %[[K:[A-Za-z_0-9]+]] = k3s.tensor_arg @k
// CHECK: %[[G:[A-Za-z_0-9]+]] = k3s.tensor_arg @g
// CHECK: %[[CU:[A-Za-z_0-9]+]] = k3s.tensor_arg @cu_seqlens
// CHECK: %[[CACHE:[A-Za-z_0-9]+]] = k3s.tensor_arg @cache <role = workspace, purpose = draft_states> : !k3s.tensor<P x 4 x 2 x 24, float32>
// CHECK-NEXT: %[[ACC:[A-Za-z_0-9]+]] = k3s.tensor_arg @accepted <role = input, purpose = accepted_counts> : !k3s.tensor<B, index>
// CHECK-NEXT: k3s.speculative <draft_tokens = 4> {
// CHECK-NEXT: ^bb0(%S: !k3s.tile<K x V>):
// CHECK-NEXT: %S_final = k3s.token_loop %S, %[[CU]] {
// CHECK: %[[k:[a-z_0-9]+]] = k3s.load_token %[[K]] :
// CHECK: %[[g:[a-z_0-9]+]] = k3s.load_gate %[[G]] <gate = channel
// CHECK-NEXT: %S_2 = k3s.decay %S_1, %[[g]] <gate = channel> : !k3s.tile<K x V>
// CHECK: %u = k3s.delta_correct %S_2, %[[k]], %{{.*}} : !k3s.tile<V>
// CHECK-NEXT: %S_3 = k3s.rank1_update %S_2, %[[k]], %u : !k3s.tile<K x V>
// CHECK-NEXT: %{{[a-z_0-9]+}} = k3s.readout %S_3, {{.*}} : !k3s.tile<V>
// CHECK-NEXT: k3s.cache_update %[[CACHE]], %[[k]], %u, %[[g]] <gate = channel>
// CHECK-NEXT: k3s.next_token %S_3
// CHECK-NEXT: } : !k3s.tile<K x V>
// CHECK-NEXT: %S_4 = k3s.replay %S, %[[CACHE]], %[[ACC]] <gate = channel> : !k3s.tile<K x V>
// CHECK: k3s.entry @dn_speculative <source = @dn>
// CHECK: %[[CACHE2:[A-Za-z_0-9]+]] = k3s.tensor_arg @cache <role = workspace, purpose = draft_states> : !k3s.tensor<P x 4 x 2 x 24, float32>
// CHECK-NEXT: %[[ACC2:[A-Za-z_0-9]+]] = k3s.tensor_arg @accepted <role = input, purpose = accepted_counts> : !k3s.tensor<B, index>
// CHECK: k3s.token_loop
// CHECK-NOT: k3s.decay
// CHECK: %[[u:[a-z_0-9]+]] = k3s.delta_correct %[[S:[A-Za-z_0-9]+]], %[[k2:[a-z_0-9]+]],
// CHECK: k3s.cache_update %[[CACHE2]], %[[k2]], %[[u]] <gate = none>
// CHECK-NEXT: k3s.next_token %S_2
// CHECK-NEXT: } : !k3s.tile<K x V>
// CHECK-NEXT: %{{S_[0-9]+}} = k3s.replay %S, %[[CACHE2]], %[[ACC2]] <gate = none> : !k3s.tile<K x V>

// ONEARG: {{^}}k3c opt: error: <stdin>: k3s.speculative: its block takes one argument, the committed state; got 2{{$}}
