// lower-speculative{verify=chunked}: the verify (and spec_step's verify half) from the stages of
// derive-chunkwise's schedule, one chunk of 16 per round (4 drafts rounded up). fuse-chunkwise's
// split gives a prepare kernel (W, U, P, QG spilled in fp32, fp32 products: the cached u become
// the committed state; KG and gamma_C, read only by the dropped
// state advance, are not computed) and a scan kernel whose state tile is the pool row, read and
// never written in verify; its chunk caches every row's k, log-decay and u = Vr. The commit stays.
// RUN: k3c opt %s -p 'derive-replay{draft-tokens=4},lower-speculative{verify=chunked}' | filecheck %s
// RUN: k3c opt %s -p 'derive-replay{draft-tokens=4},lower-speculative{verify=chunked}' | k3c opt - | filecheck %s
// RUN: not k3c opt %s -p 'derive-replay,lower-speculative{verify=chunks}' 2>&1 | filecheck %s --check-prefix=BADVERIFY
// RUN: not k3c opt %s -p 'derive-replay{draft-tokens=65},lower-speculative{verify=chunked}' 2>&1 | filecheck %s --check-prefix=DEEP
// verify-dots=tf32x3: the same kernels with fp32-accurate tensor-core products
// RUN: k3c opt %s -p 'derive-replay{draft-tokens=4},lower-speculative{verify=chunked verify-dots=tf32x3}' | filecheck %s --check-prefix=TF32X3

builtin.module {
  k3.recurrence @gdn <gate = scalar, delta_rule = true, num_heads = 2, num_v_heads = 4, head_k_dim = 8, head_v_dim = 16, scale = 0.5, state_layout = kv, dtype = float32>
}

// CHECK: k3s.entry @verify <source = @gdn, max_tokens = 4> {
// CHECK-DAG: %state = k3s.tensor_arg @state <role = input> : !k3s.tensor<P x 4 x 8 x 16, state>
// CHECK-DAG: %[[VERIFY_CACHE:cache]] = k3s.tensor_arg @cache <role = inout, purpose = draft_states> : !k3s.tensor<P x 4 x 4 x 32, float32>
// CHECK-DAG: %[[W:W]] = k3s.tensor_arg @W <role = workspace> : !k3s.tensor<B x T x 4 x 8, float32>
// CHECK-DAG: %[[U:U]] = k3s.tensor_arg @U <role = workspace> : !k3s.tensor<B x T x 4 x 16, float32>
// CHECK: k3s.kernel @gdn_verify_prepare <grid = [chunk, value_head], num_warps = 2, dots = fp32>
// CHECK-NEXT: k3s.chunk_tile <chunk_size = 16
// CHECK-NOT: k3s.chunk_decay
// CHECK-NOT: anchor = end
// CHECK: %[[W_TILE:W_[0-9]+]] = k3s.wy_apply
// CHECK-NEXT: k3s.spill %[[W]], %[[W_TILE]]
// CHECK: %[[U_TILE:U_[0-9]+]] = k3s.wy_apply
// CHECK-NEXT: k3s.spill %[[U]], %[[U_TILE]]
// CHECK-NEXT: }
// CHECK-NEXT: k3s.kernel @gdn_verify <grid = [value_block, sequence_head], num_warps = 2, num_stages = 1, dots = fp32>
// CHECK-NEXT: %S = k3s.state_tile %state, %state_indices <{{.*}}home = pool> : !k3s.tile<K x V>
// CHECK-NEXT: %S_final = k3s.chunk_loop %S <chunk_size = 16> {
// CHECK: %[[U_RELOADED:U_[0-9]+]] = k3s.reload %[[U]] : !k3s.tile<C x V>
// CHECK-NEXT: %[[W_RELOADED:W_[0-9]+]] = k3s.reload %[[W]] : !k3s.tile<C x K>
// CHECK-NEXT: %vr = k3s.delta_residual %S_1, %[[W_RELOADED]], %[[U_RELOADED]] : !k3s.tile<C x V>
// CHECK-NEXT: %o_1 = k3s.chunk_output %QG_1, %S_1, %P_1, %vr, %o, %scale : !k3s.tile<C x V>
// CHECK-NOT: k3s.state_advance
// CHECK: k3s.cache_update %[[VERIFY_CACHE]], %k_1, %vr, %g_1 <gate = scalar>
// CHECK-NEXT: k3s.next_chunk %S_1{{$}}
// CHECK-NEXT: } : !k3s.tile<K x V>
// CHECK-NEXT: }
// CHECK-NEXT: }
// CHECK-NEXT: k3s.entry @commit <source = @gdn> {
// CHECK: %[[COMMIT_CACHE:cache]] = k3s.tensor_arg @cache <role = input, purpose = draft_states>
// CHECK-NEXT: %[[COMMIT_ACCEPTED:accepted]] = k3s.tensor_arg @accepted <role = input, purpose = accepted_counts>
// CHECK: k3s.kernel @gdn_commit
// CHECK-NEXT: %S = k3s.state_tile {{.*}}home = pool> : !k3s.tile<K x V>
// CHECK-NEXT: %S_1 = k3s.replay %S, %[[COMMIT_CACHE]], %[[COMMIT_ACCEPTED]] <gate = scalar> : !k3s.tile<K x V>
// CHECK-NEXT: k3s.store_state %S_1, {{.*}}<layout = kv, home = pool>
// CHECK: k3s.entry @spec_step <source = @gdn, max_tokens = 4> {
// CHECK: %[[STEP_CACHE:cache]] = k3s.tensor_arg @cache <role = input, purpose = draft_states>
// CHECK-NEXT: %[[STEP_ACCEPTED:accepted]] = k3s.tensor_arg @accepted <role = input, purpose = accepted_counts>
// CHECK-NEXT: %[[NEXT_CACHE:next_cache]] = k3s.tensor_arg @next_cache <role = inout, purpose = draft_states, distinct_from = @cache>
// CHECK: %[[STEP_W:W]] = k3s.tensor_arg @W <role = workspace> : !k3s.tensor<B x T x 4 x 8, float32>
// CHECK: k3s.kernel @gdn_spec_step_prepare <grid = [chunk, value_head]
// CHECK: k3s.spill %[[STEP_W]], %{{W_[0-9]+}}
// CHECK: k3s.kernel @gdn_spec_step <grid = [value_block, sequence_head]
// the scan commits the row, then verifies from the replayed state
// CHECK-NEXT: %S = k3s.state_tile {{.*}}home = pool> : !k3s.tile<K x V>
// CHECK-NEXT: %S_1 = k3s.replay %S, %[[STEP_CACHE]], %[[STEP_ACCEPTED]] <gate = scalar> : !k3s.tile<K x V>
// CHECK-NEXT: k3s.store_state %S_1, {{.*}}<layout = kv, home = pool>
// CHECK-NEXT: %S_final = k3s.chunk_loop %S_1 <chunk_size = 16> {
// CHECK-NEXT: ^bb0(%S_2: !k3s.tile<K x V>):
// CHECK: k3s.reload %[[STEP_W]] : !k3s.tile<C x K>
// CHECK: k3s.cache_update %[[NEXT_CACHE]], %k_1, %vr, %g_1 <gate = scalar>
// CHECK-NEXT: k3s.next_chunk %S_2{{$}}
// CHECK-NEXT: } : !k3s.tile<K x V>
// CHECK-NEXT: }

// BADVERIFY: {{^}}k3c opt: error: {{.*}}verify must be token or chunked, got 'chunks'{{.*$}}
// DEEP: {{^}}k3c opt: error: {{.*}}verify=chunked needs draft-tokens <= 64, got 65{{.*$}}

// TF32X3: k3s.kernel @gdn_verify_prepare <grid = [chunk, value_head], num_warps = 2, dots = tf32x3>
// TF32X3: k3s.kernel @gdn_verify <grid = [value_block, sequence_head], num_warps = 2, num_stages = 1, dots = tf32x3>
