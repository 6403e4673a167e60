// lower-speculative: the speculative schedule becomes its serving entries. verify reads the
// committed pool row (no store_state) and caches each token; commit replays the accepted
// tokens and writes the row back in place; spec_step fuses them, replay first: it replays the
// previous round from `cache`, writes the row once, then verifies into `next_cache` (a second
// buffer: other value blocks may still read the first).
// RUN: k3c opt %s -p 'derive-replay{draft-tokens=4},lower-speculative' | filecheck %s
// RUN: k3c opt %s -p 'derive-replay{draft-tokens=4},lower-speculative' | k3c opt - | filecheck %s
// mode=snapshot, the baseline: a whole state per verified token instead of the cache.
// RUN: k3c opt %s -p 'derive-replay{draft-tokens=4},lower-speculative{mode=snapshot}' | filecheck %s --check-prefix=SNAP
// RUN: not k3c opt %s -p 'derive-replay,lower-speculative{mode=copy}' 2>&1 | filecheck %s --check-prefix=BADMODE

builtin.module {
  k3.recurrence @gdn <gate = scalar, delta_rule = true, num_heads = 2, num_v_heads = 4, head_k_dim = 8, head_v_dim = 16, scale = 0.5, state_layout = kv, dtype = float32>
}

// CHECK: k3s.entry @verify <source = @gdn, max_tokens = 4> {
// CHECK-DAG: %state = k3s.tensor_arg @state <role = input> : !k3s.tensor<P x 4 x 8 x 16, state>
// CHECK-DAG: %[[VERIFY_CACHE:cache]] = k3s.tensor_arg @cache <role = inout, purpose = draft_states> : !k3s.tensor<P x 4 x 4 x 32, float32>
// CHECK: k3s.kernel @gdn_verify
// the verify reads the pool row; its token loop runs over the rows of a batch (no cu_seqlens)
// CHECK-NEXT: %S = k3s.state_tile %state, %state_indices <{{.*}}home = pool> : !k3s.tile<K x V>
// CHECK-NEXT: %S_final = k3s.token_loop %S {
// CHECK: %S_2 = k3s.decay %S_1, %g_1 <gate = scalar> : !k3s.tile<K x V>
// CHECK: k3s.cache_update %[[VERIFY_CACHE]], %k_1, %u, %g_1 <gate = scalar>
// CHECK-NEXT: k3s.next_token %S_3
// CHECK-NEXT: } : !k3s.tile<K x V>
// CHECK-NOT: k3s.store_state
// CHECK: k3s.entry @commit <source = @gdn> {
// CHECK-DAG: %state = k3s.tensor_arg @state <role = inout> : !k3s.tensor<P x 4 x 8 x 16, state>
// CHECK-DAG: %[[COMMIT_CACHE:cache]] = k3s.tensor_arg @cache <role = input, purpose = draft_states> : !k3s.tensor<P x 4 x 4 x 32, float32>
// CHECK-DAG: %[[COMMIT_ACCEPTED:accepted]] = k3s.tensor_arg @accepted <role = input, purpose = accepted_counts> : !k3s.tensor<B, index>
// CHECK: k3s.kernel @gdn_commit
// CHECK-NEXT: %S = k3s.state_tile {{.*}}home = pool> : !k3s.tile<K x V>
// CHECK-NEXT: %S_1 = k3s.replay %S, %[[COMMIT_CACHE]], %[[COMMIT_ACCEPTED]] <gate = scalar> : !k3s.tile<K x V>
// CHECK-NEXT: k3s.store_state %S_1, {{.*}}<layout = kv, home = pool>
// CHECK: k3s.entry @spec_step <source = @gdn, max_tokens = 4> {
// CHECK-DAG: %state = k3s.tensor_arg @state <role = inout> : !k3s.tensor<P x 4 x 8 x 16, state>
// CHECK-DAG: %[[STEP_CACHE:cache]] = k3s.tensor_arg @cache <role = input, purpose = draft_states> : !k3s.tensor<P x 4 x 4 x 32, float32>
// CHECK-DAG: %[[STEP_ACCEPTED:accepted]] = k3s.tensor_arg @accepted <role = input, purpose = accepted_counts> : !k3s.tensor<B, index>
// CHECK-DAG: %[[NEXT_CACHE:next_cache]] = k3s.tensor_arg @next_cache <role = inout, purpose = draft_states, distinct_from = @cache> : !k3s.tensor<P x 4 x 4 x 32, float32>
// CHECK: k3s.kernel @gdn_spec_step
// the round's verify goes on from the replayed state
// CHECK-NEXT: %S = k3s.state_tile {{.*}}home = pool> : !k3s.tile<K x V>
// CHECK-NEXT: %S_1 = k3s.replay %S, %[[STEP_CACHE]], %[[STEP_ACCEPTED]] <gate = scalar> : !k3s.tile<K x V>
// CHECK-NEXT: k3s.store_state %S_1, {{.*}}<layout = kv, home = pool>
// CHECK-NEXT: %S_final = k3s.token_loop %S_1 {
// CHECK-NEXT: ^bb0(%S_2: !k3s.tile<K x V>):
// CHECK: %S_3 = k3s.decay %S_2, %g_1 <gate = scalar> : !k3s.tile<K x V>
// CHECK: k3s.cache_update %[[NEXT_CACHE]], %k_1, %u, %g_1 <gate = scalar>
// CHECK-NEXT: k3s.next_token %S_4
// CHECK-NEXT: } : !k3s.tile<K x V>

// SNAP: %[[VERIFY_BUFFER:snapshots]] = k3s.tensor_arg @snapshots <role = inout, purpose = draft_states> : !k3s.tensor<P x 4 x 4 x 8 x 16, float32>
// SNAP: %S_2 = k3s.decay %S_1, %g_1 <gate = scalar> : !k3s.tile<K x V>
// SNAP: k3s.snapshot_state %[[VERIFY_BUFFER]], %S_3
// SNAP-NEXT: k3s.next_token %S_3
// SNAP-NOT: k3s.cache_update
// SNAP: %[[COMMIT_BUFFER:snapshots]] = k3s.tensor_arg @snapshots <role = input, purpose = draft_states> : !k3s.tensor<P x 4 x 4 x 8 x 16, float32>
// SNAP: %[[ACCEPTED:accepted]] = k3s.tensor_arg @accepted <role = input, purpose = accepted_counts> : !k3s.tensor<B, index>
// SNAP: k3s.kernel @gdn_commit
// SNAP-NEXT: %S = k3s.state_tile
// SNAP-NEXT: %S_1 = k3s.restore_snapshot %S, %[[COMMIT_BUFFER]], %[[ACCEPTED]] : !k3s.tile<K x V>
// SNAP-NEXT: k3s.store_state %S_1, {{.*}}<layout = kv, home = pool>
// SNAP-NOT: k3s.entry @spec_step
// BADMODE: {{^}}k3c opt: error: {{.*}}mode must be replay or snapshot, got 'copy'{{.*$}}
