// lower-segment-scan: the segment_scan entry becomes `segment_summary`, the state pass of the
// chunked schedule (no query Gram, no output) as a prepare kernel and a scan from zero storing
// N; a full transition adds a scan of K identity columns with a zero value input storing M, a
// diagonal one multiplies the chunk decays up in the N scan (M a second value its chunk loop
// carries, from 1, stored after it), and the identity has no M. And
// `chunk_segments`: the full prepare once, the same summary scans reading its workspaces, the
// combine as a host step making the entering states, the chunk scan finishing from them.
// RUN: k3c opt %s -p 'derive-segment-scan{chunk-size=16},lower-segment-scan{block-v=8}' | filecheck %s
// RUN: k3c opt %s -p 'derive-segment-scan{chunk-size=16},lower-segment-scan{block-v=8}' | k3c opt - | filecheck %s
// RUN: not k3c opt %s -p 'derive-segment-scan,lower-segment-scan{block-v=3}' 2>&1 | filecheck %s --check-prefix=BAD

builtin.module {
  k3.recurrence @kda <gate = channel, delta_rule = true, num_heads = 2, num_v_heads = 2, head_k_dim = 8, head_v_dim = 4, scale = 0.5, state_layout = kv, dtype = float32>
  k3.recurrence @gla <gate = channel, delta_rule = false, num_heads = 2, num_v_heads = 2, head_k_dim = 8, head_v_dim = 8, scale = 0.5, state_layout = vk, dtype = float32>
  k3.recurrence @linear <gate = none, delta_rule = false, num_heads = 2, num_v_heads = 2, head_k_dim = 8, head_v_dim = 8, scale = 0.5, state_layout = kv, dtype = float32>
}

// CHECK:      k3s.entry @kda_segment_summary <source = @kda> {
// CHECK-NOT:    k3s.tensor_arg @q
// CHECK:        %[[CU:[A-Za-z_0-9]+]] = k3s.tensor_arg @cu_seqlens
// CHECK:        %[[M:[A-Za-z_0-9]+]] = k3s.tensor_arg @M <role = output> : !k3s.tensor<N x 2 x 8 x 8, float32>
// CHECK-NEXT:   %[[N:[A-Za-z_0-9]+]] = k3s.tensor_arg @N <role = output> : !k3s.tensor<N x 2 x 8 x 4, float32>
// CHECK:        k3s.kernel @kda_summary_prepare <grid = [chunk, value_head]
// CHECK-NEXT:     k3s.chunk_tile %[[CU]] <chunk_size = 16
// CHECK-NOT:      k3s.gram %q
// CHECK-NOT:      k3s.load_chunk %q
// CHECK:        k3s.kernel @kda_summary_scan_N
// the N scan starts from zero, reading no initial state, and writes N
// CHECK-NEXT:     %S = k3s.state_tile <head_k_dim = 8, head_v_dim = 4, block_v = 8, layout = kv, start = zero> : !k3s.tile<K x V>
// CHECK-NEXT:     %S_final = k3s.chunk_loop %S, %[[CU]] <chunk_size = 16> {
// CHECK-NOT:      k3s.chunk_output
// CHECK:          %vr = k3s.delta_residual %S_1, %{{[A-Za-z_0-9]+}}, %{{[A-Za-z_0-9]+}} : !k3s.tile<C x V>
// CHECK:        k3s.store_state %S_final, %[[N]] <layout = kv>
// CHECK:        k3s.kernel @kda_summary_scan_M
// CHECK-NEXT:     %S = k3s.state_tile <head_k_dim = 8, head_v_dim = 8, block_v = 8, layout = kv, start = identity> : !k3s.tile<K x V>
// CHECK-NOT:      k3s.reload %U
// CHECK:          %{{[A-Za-z_0-9]+}} = k3s.delta_residual %{{[A-Za-z_0-9]+}}, %{{[A-Za-z_0-9]+}} : !k3s.tile<C x V>
// CHECK:        k3s.store_state %S_final, %[[M]] <layout = kv>

// The summary scans of chunk_segments reload the workspaces of its own prepare.
// CHECK:      k3s.entry @kda_chunk_segments <source = @kda> {
// CHECK-NEXT:   %[[Q2:[A-Za-z_0-9]+]] = k3s.tensor_arg @q
// CHECK-NEXT:   %[[K2:[A-Za-z_0-9]+]] = k3s.tensor_arg @k
// CHECK:        %[[SCALE2:[A-Za-z_0-9]+]] = k3s.scalar_arg @scale
// CHECK-NEXT:   %[[H02:[A-Za-z_0-9]+]] = k3s.tensor_arg @initial_state <role = combined> : !k3s.tensor<N x 2 x 8 x 4, float32>
// CHECK-NEXT:   %[[O2:[A-Za-z_0-9]+]] = k3s.tensor_arg @o
// CHECK-NEXT:   %[[HT2:[A-Za-z_0-9]+]] = k3s.tensor_arg @final_state
// CHECK-NEXT:   %[[CU2:[A-Za-z_0-9]+]] = k3s.tensor_arg @cu_seqlens
// CHECK:        %[[M2:[A-Za-z_0-9]+]] = k3s.tensor_arg @M <role = workspace> : !k3s.tensor<N x 2 x 8 x 8, float32>
// CHECK-NEXT:   %[[N2:[A-Za-z_0-9]+]] = k3s.tensor_arg @N <role = workspace> : !k3s.tensor<N x 2 x 8 x 4, float32>
// the one prepare reads this entry's tensors (the schedule was derived in the segment_scan entry)
// CHECK:        k3s.kernel @kda_segments_prepare <grid = [chunk, value_head]
// CHECK-NEXT:     k3s.chunk_tile %[[CU2]] <chunk_size = 16
// CHECK:          %[[q2:[a-z_0-9]+]] = k3s.load_chunk %[[Q2]] : !k3s.tile<C x K>
// CHECK:          %{{[A-Za-z_0-9]+}} = k3s.gram %[[q2]], %{{.*}}, %[[K2]], %{{[A-Za-z_0-9]+}} <mask = inclusive
// CHECK-NOT:    k3s.kernel @kda_segments_prepare
// CHECK:        k3s.kernel @kda_segments_summary_scan_N
// CHECK:        k3s.store_state %S_final, %[[N2]] <layout = kv>
// CHECK:        k3s.kernel @kda_segments_summary_scan_M
// CHECK:        k3s.store_state %S_final, %[[M2]] <layout = kv>
// CHECK:        k3s.summary_combine %[[M2]], %[[N2]], %[[H02]] <transition = full>
// CHECK-NEXT:   k3s.kernel @kda_segments_scan
// the finish starts from the states the combine step made
// CHECK-NEXT:     %S = k3s.state_tile %[[H02]] <head_k_dim = 8, head_v_dim = 4, block_v = 8, layout = kv> : !k3s.tile<K x V>
// CHECK-NEXT:     %S_final = k3s.chunk_loop %S, %[[CU2]] <chunk_size = 16> {
// CHECK:            %{{[A-Za-z_0-9]+}} = k3s.chunk_output %{{[A-Za-z_0-9]+}}, %{{[A-Za-z_0-9]+}}, %{{[A-Za-z_0-9]+}}, %{{[A-Za-z_0-9]+}}, %[[O2]], %[[SCALE2]] : !k3s.tile<C x V>
// CHECK:          k3s.store_state %S_final, %[[HT2]] <layout = kv>

// CHECK:      k3s.entry @gla_segment_summary <source = @gla> {
// CHECK:        %[[M3:[A-Za-z_0-9]+]] = k3s.tensor_arg @M <role = output> : !k3s.tensor<N x 2 x 8, float32>
// CHECK-NEXT:   %[[N3:[A-Za-z_0-9]+]] = k3s.tensor_arg @N <role = output> : !k3s.tensor<N x 2 x 8 x 8, float32>
// the N scan's chunk loop carries M, the product of the decays, from 1 beside the state
// CHECK:        k3s.kernel @gla_summary_scan_N
// CHECK-NEXT:     %S = k3s.state_tile
// CHECK-NEXT:     %[[M_START:[A-Za-z_0-9]+]] = k3s.decay_product_start <transition = diagonal> : !k3s.tile<K>
// CHECK-NEXT:     %S_final, %M_final = k3s.chunk_loop %S, %[[M_START]], %{{[A-Za-z_0-9]+}} <chunk_size = 16> {
// CHECK-NEXT:     ^bb0(%[[S_IN:[A-Za-z_0-9]+]]: !k3s.tile<K x V>, %[[M_IN:[A-Za-z_0-9]+]]: !k3s.tile<K>):
// CHECK:            %[[S_OUT:[A-Za-z_0-9]+]] = k3s.state_advance %[[S_IN]], %{{[A-Za-z_0-9]+}}, %{{[A-Za-z_0-9]+}}, %[[DECAY:[A-Za-z_0-9]+]] <gate = channel>
// CHECK-NEXT:       %[[M_OUT:[A-Za-z_0-9]+]] = k3s.decay_product %[[M_IN]], %[[DECAY]] <transition = diagonal> : !k3s.tile<K>
// CHECK-NEXT:       k3s.next_chunk %[[S_OUT]], %[[M_OUT]]
// CHECK-NEXT:     } : !k3s.tile<K x V>, !k3s.tile<K>
// CHECK-NEXT:   k3s.store_state %S_final, %[[N3]] <layout = vk>
// CHECK-NEXT:   k3s.store_transition %M_final, %[[M3]] <transition = diagonal>
// CHECK-NOT:    k3s.kernel @gla_summary_scan_M
// CHECK:      k3s.entry @gla_chunk_segments <source = @gla> {
// CHECK:        %[[GLA_INITIAL:initial_state]] = k3s.tensor_arg @initial_state <role = combined>
// CHECK:        %[[GLA_SEGMENTS_M:M]] = k3s.tensor_arg @M <role = workspace> : !k3s.tensor<N x 2 x 8, float32>
// CHECK-NEXT:   %[[GLA_SEGMENTS_N:N]] = k3s.tensor_arg @N <role = workspace>
// CHECK:        k3s.store_transition %M_final, %[[GLA_SEGMENTS_M]] <transition = diagonal>
// CHECK:        k3s.summary_combine %[[GLA_SEGMENTS_M]], %[[GLA_SEGMENTS_N]], %[[GLA_INITIAL]] <transition = diagonal>

// CHECK:      k3s.entry @linear_segment_summary <source = @linear> {
// CHECK-NOT:    k3s.tensor_arg @M
// CHECK:        k3s.tensor_arg @N
// CHECK-NOT:    k3s.decay_product
// CHECK:      k3s.entry @linear_chunk_segments <source = @linear> {
// CHECK:        %[[LINEAR_INITIAL:initial_state]] = k3s.tensor_arg @initial_state <role = combined>
// CHECK-NOT:    k3s.tensor_arg @M
// CHECK:        %[[LINEAR_N:N]] = k3s.tensor_arg @N <role = workspace>
// CHECK:        k3s.summary_combine %[[LINEAR_N]], %[[LINEAR_INITIAL]] <transition = identity>

// BAD: k3c opt: error: pipeline {{.*}}: lower-segment-scan: block-v must be a power of two, got 3
