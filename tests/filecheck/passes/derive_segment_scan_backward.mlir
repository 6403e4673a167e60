// derive-segment-scan-backward: a recurrence's `chunk_backward_segments` entry (docs/context-parallel.md,
// "The backward"), after lower-backward: chunk_backward's prepare, chunk_segments' summary scans on its
// workspaces, the cotangent scan from zero (dht, absent before the combine that makes it) storing each
// segment's N_bar (no spills), the forward's combine (the entering states) and its adjoint, the same
// combine transposed (the leaving cotangents), then chunk_backward's state scan, cotangent scan and
// gradients. The output re-parses; a diagonal M's adjoint.
// RUN: k3c ir %examples/kda.toml -p derive-chunkwise,fuse-chunkwise,derive-segment-scan,lower-segment-scan,derive-backward,lower-backward,derive-segment-scan-backward | filecheck %s
// RUN: k3c ir %examples/kda.toml -p derive-chunkwise,fuse-chunkwise,derive-segment-scan,lower-segment-scan,derive-backward,lower-backward,derive-segment-scan-backward | k3c opt - | filecheck %s
// RUN: k3c ir %examples/gla.toml -p derive-chunkwise,fuse-chunkwise,derive-segment-scan,lower-segment-scan,derive-backward,lower-backward,derive-segment-scan-backward | filecheck %s --check-prefix=GLA
// Without a chunk_segments entry, nothing to add.
// RUN: k3c ir %examples/kda.toml -p derive-backward,lower-backward,derive-segment-scan-backward | filecheck %s --check-prefix=NONE

// CHECK-LABEL: k3s.entry @chunk_backward <source = @kda> {
// CHECK-LABEL: k3s.entry @chunk_backward_segments <source = @kda> {
// CHECK:         %initial_state = k3s.tensor_arg @initial_state <role = combined>
// CHECK:         %do = k3s.tensor_arg @do <role = input>
// CHECK-NEXT:    %dht = k3s.tensor_arg @dht <role = combined>
// CHECK:         %M = k3s.tensor_arg @M <role = workspace> : !k3s.tensor<N x 32 x 128 x 128, float32>
// CHECK-NEXT:    %N = k3s.tensor_arg @N <role = workspace>
// CHECK-NEXT:    %N_bar = k3s.tensor_arg @N_bar <role = workspace> : !k3s.tensor<N x 32 x 128 x 128, float32>
// CHECK-NEXT:    k3s.kernel @kda_backward_segments_prepare
// CHECK:         k3s.kernel @kda_backward_segments_summary_scan_N
// CHECK:           k3s.store_state %S_final, %N
// CHECK:         k3s.kernel @kda_backward_segments_summary_scan_M
// CHECK:           k3s.store_state %S_final, %M
// the cotangent summary's state tile reads dht, which the adjoint combine makes after it: absent, zero
// CHECK:         k3s.kernel @kda_backward_segments_cotangent_summary
// CHECK-NEXT:      %{{S(_[0-9]+)?}} = k3s.state_tile %dht <{{.*}}> : !k3s.tile<K x V>
// CHECK-NOT:       k3s.spill
// CHECK:           k3s.store_state %S_final, %N_bar
// CHECK-NEXT:    }
// CHECK-NEXT:    k3s.summary_combine %M, %N, %initial_state <transition = full>
// CHECK-NEXT:    k3s.summary_combine %M, %N_bar, %dht <transition = full, adjoint = true>
// CHECK-NEXT:    k3s.kernel @kda_backward_segments_state_scan
// CHECK-NEXT:      %{{S(_[0-9]+)?}} = k3s.state_tile %initial_state
// CHECK:         k3s.kernel @kda_backward_segments_cotangent_scan
// CHECK-NEXT:      %{{S(_[0-9]+)?}} = k3s.state_tile %dht
// CHECK:           k3s.spill %S_bar
// CHECK:           k3s.store_state %S_final, %dh0
// CHECK:         k3s.kernel @kda_backward_segments_gradients

// GLA-LABEL:   k3s.entry @chunk_backward_segments <source = @gla> {
// GLA:         k3s.summary_combine %M, %N, %initial_state <transition = diagonal>
// GLA-NEXT:    k3s.summary_combine %M, %N_bar, %dht <transition = diagonal, adjoint = true>

// NONE:     k3s.entry @chunk_backward <source = @kda>
// NONE-NOT: chunk_backward_segments
