// fuse-chunkwise{grouping=split-prepare}: the prepare as two token-parallel kernels. gram runs
// the gate cumsum, the Grams and the triangular solve and spills T (workspace T_ut, a [C, C]
// block per chunk; the solve runs as soon as the key Gram is done: T is only spilled) beside the
// query Gram and the chunk decay; wy reloads T, rebuilds the gate's
// cumsum and runs the WY products and gate applications; the scan is the split grouping's.
// RUN: k3c opt %s -p 'derive-chunkwise{chunk-size=16},fuse-chunkwise{grouping=split-prepare block-v=8}' | filecheck %s
// RUN: k3c opt %s -p 'derive-chunkwise{chunk-size=16},fuse-chunkwise{grouping=split-prepare block-v=8}' | k3c opt - | filecheck %s
// RUN: not k3c opt %s -p 'derive-chunkwise,fuse-chunkwise{grouping=fused}' 2>&1 | filecheck %s --check-prefix=BAD
// prepare-maxnreg caps the token-parallel kernels' registers (both of split-prepare), not the scan's.
// RUN: k3c opt %s -p 'derive-chunkwise,fuse-chunkwise{grouping=split-prepare prepare-maxnreg=168}' | filecheck %s --check-prefix=CAP
// RUN: not k3c opt %s -p 'derive-chunkwise,fuse-chunkwise{prepare-maxnreg=16}' 2>&1 | filecheck %s --check-prefix=BADCAP

builtin.module {
  k3.recurrence @kda <gate = channel, delta_rule = true, num_heads = 2, num_v_heads = 2, head_k_dim = 8, head_v_dim = 4, scale = 0.5, state_layout = kv, dtype = float32>
}

// CHECK:      k3s.entry @chunk <source = @kda> {
// CHECK-NEXT:   %[[Q:[A-Za-z_0-9]+]] = k3s.tensor_arg @q
// CHECK-NEXT:   %[[K:[A-Za-z_0-9]+]] = k3s.tensor_arg @k
// CHECK-NEXT:   %[[V:[A-Za-z_0-9]+]] = k3s.tensor_arg @v
// CHECK-NEXT:   %[[G:[A-Za-z_0-9]+]] = k3s.tensor_arg @g
// CHECK-NEXT:   %{{[A-Za-z_0-9]+}} = k3s.tensor_arg @beta
// CHECK-NEXT:   %[[SCALE:[A-Za-z_0-9]+]] = k3s.scalar_arg @scale
// CHECK-NEXT:   %[[H0:[A-Za-z_0-9]+]] = k3s.tensor_arg @initial_state
// CHECK-NEXT:   %[[O:[A-Za-z_0-9]+]] = k3s.tensor_arg @o
// CHECK-NEXT:   %[[HT:[A-Za-z_0-9]+]] = k3s.tensor_arg @final_state
// CHECK-NEXT:   %[[CU:[A-Za-z_0-9]+]] = k3s.tensor_arg @cu_seqlens
// CHECK:        %[[T_UT:T_ut]] = k3s.tensor_arg @T_ut <role = workspace> : !k3s.tensor<B x T x 2 x 16, float>
// CHECK-NEXT:   %[[WS_U:U]] = k3s.tensor_arg @U <role = workspace> : !k3s.tensor<B x T x 2 x 4, float>
// CHECK-NEXT:   %[[WS_W:W]] = k3s.tensor_arg @W <role = workspace> : !k3s.tensor<B x T x 2 x 8, float>
// CHECK:        k3s.kernel @kda_chunk_gram <grid = [chunk, value_head]
// CHECK-NEXT:     k3s.chunk_tile %[[CU]] <chunk_size = 16
// CHECK:          %[[k:[a-z_0-9]+]] = k3s.load_chunk %[[K]] : !k3s.tile<C x K>
// CHECK:          %factorable = k3s.block_span_check %Gstart, %Gend
// CHECK:          %A = k3s.gram %[[k]], %[[k]], %G, %Gstart, %Gend, %kl, %kr, %kd, %[[beta:[a-z_0-9]+]], %factorable, %[[K]], %[[G]] <mask = strict
// CHECK-NEXT:     %[[T:[A-Za-z_0-9]+]] = k3s.forward_substitution %A, %[[beta]]
// CHECK-NEXT:     k3s.spill %[[T_UT]], %[[T]]
// CHECK:          %[[q:[a-z_0-9]+]] = k3s.load_chunk %[[Q]] : !k3s.tile<C x K>
// CHECK:          %{{[A-Za-z_0-9]+}} = k3s.gram %[[q]], %[[k]], %G, %Gstart, %Gend, %ql, %kr, %kd, %factorable, %[[K]], %[[G]] <mask = inclusive
// CHECK-NOT:      k3s.wy_apply
// CHECK:        k3s.kernel @kda_chunk_wy <grid = [chunk, value_head]
// CHECK-NEXT:     k3s.chunk_tile %[[CU]] <chunk_size = 16
// CHECK-NEXT:     %[[T2:[A-Za-z_0-9]+]] = k3s.reload %[[T_UT]] : !k3s.tile<C x C>
// CHECK:          %[[G2:[A-Za-z_0-9]+]] = k3s.gate_cumsum %{{[a-z_0-9]+}}
// CHECK-NOT:      k3s.gram
// CHECK:          %[[k2:[a-z_0-9]+]] = k3s.load_chunk %[[K]]
// CHECK-NEXT:     %[[W:[A-Za-z_0-9]+]] = k3s.wy_apply %[[T2]], %[[k2]], %[[G2]] <gate = channel>
// CHECK:          k3s.spill %[[WS_W]], %[[W]]
// CHECK:          %[[v2:[a-z_0-9]+]] = k3s.load_chunk %[[V]]
// CHECK-NEXT:     %[[U:[A-Za-z_0-9]+]] = k3s.wy_apply %[[T2]], %[[v2]] <gate = none>
// CHECK:          k3s.spill %[[WS_U]], %[[U]]
// CHECK:        k3s.kernel @kda_chunk_scan <grid = [value_block, sequence_head]
// CHECK-NEXT:     %S = k3s.state_tile %[[H0]] <
// CHECK-NEXT:     %S_final = k3s.chunk_loop %S, %[[CU]] <chunk_size = 16> {
// CHECK:            k3s.chunk_output {{.*}}, %[[O]], %[[SCALE]] : !k3s.tile<C x V>
// CHECK:          k3s.store_state %S_final, %[[HT]] <layout = kv>

// BAD: k3c opt: error: pipeline {{.*}}: fuse-chunkwise: unknown grouping 'fused'; allowed: split, split-prepare

// CAP: k3s.kernel @kda_chunk_gram <grid = [chunk, value_head], num_warps = 4, maxnreg = 168>
// CAP: k3s.kernel @kda_chunk_wy <grid = [chunk, value_head], num_warps = 4, maxnreg = 168>
// CAP: k3s.kernel @kda_chunk_scan <grid = [value_block, sequence_head], num_warps = 4, num_stages = 3> {

// BADCAP: k3c opt: error: pipeline {{.*}}: fuse-chunkwise: prepare-maxnreg must be 0 (no cap) or in 24..255, got 16
