// merge-identical-kernels: a kernel whose body and code properties equal those of an earlier
// kernel of another entry runs that kernel's code (shares_code_of); launch settings (warps,
// stages, block sizes, the values of its flags) may differ; each reads and writes its own entry's
// tensors, the same-named ones. The chunk entry and chunk_segments
// share their prepare and scan, segment_summary and chunk_segments their summary scans. After
// guard-spill-only-stages the three prepares have one body, the query Gram P and the gated
// queries QG under a guard that segment_summary's launch turns off: they share the first one's
// code (here segment_summary's, the first entry). Without guard-spill-only-stages the summary
// prepare, which has no query stages, keeps its own code. Running the passes again changes
// nothing, and the IR they print parses back.
// RUN: k3c opt %s -p 'derive-segment-scan{chunk-size=16},lower-segment-scan{block-v=8},derive-chunkwise{chunk-size=16},fuse-chunkwise{block-v=8},outline-kernels,guard-spill-only-stages,merge-identical-kernels' | filecheck %s
// RUN: k3c opt %s -p 'derive-segment-scan{chunk-size=16},lower-segment-scan{block-v=8},derive-chunkwise{chunk-size=16},fuse-chunkwise{block-v=8},outline-kernels,guard-spill-only-stages,merge-identical-kernels,guard-spill-only-stages,merge-identical-kernels' | k3c opt - | filecheck %s
// RUN: k3c opt %s -p 'derive-segment-scan{chunk-size=16},lower-segment-scan{block-v=8},derive-chunkwise{chunk-size=16},fuse-chunkwise{block-v=8},outline-kernels,merge-identical-kernels' | filecheck %s --check-prefix=OWN

builtin.module {
  k3.recurrence @kda <gate = channel, delta_rule = true, num_heads = 2, num_v_heads = 2, head_k_dim = 8, head_v_dim = 4, scale = 0.5, state_layout = kv, dtype = float32>
}

// CHECK:      k3s.kernel @kda_summary_prepare <grid = [chunk, value_head], num_warps = 4, flags = {SPILL_P_QG = false}> {
// CHECK:          k3s.spill %KG, %{{[A-Za-z_0-9]+}}
// CHECK-NEXT:     k3s.when <flag = SPILL_P_QG> {
// CHECK-NEXT:       %{{[a-z_0-9]+}} = k3s.load_chunk %q : !k3s.tile<C x K>
// CHECK:            k3s.spill %P, %{{[A-Za-z_0-9]+}}
// CHECK:            k3s.spill %QG, %{{[A-Za-z_0-9]+}}
// CHECK-NEXT:     }
// CHECK-NEXT:     %T = k3s.forward_substitution
// CHECK:        k3s.kernel @kda_summary_scan_N <grid = [value_block, sequence_head], num_warps = 4, num_stages = 2> {
// CHECK:        k3s.kernel @kda_summary_scan_M <grid = [value_block, sequence_head], num_warps = 4, num_stages = 2> {
// CHECK:      k3s.entry @segment_summary <source = @kda> {
// the query load the summary prepare's launch skips reads a tensor its entry lacks, and the
// query spills write workspaces it lacks: absent tensors, passed as None
// CHECK:        %[[Q:[A-Za-z_0-9]+]] = k3s.absent_tensor : !k3s.tensor<B x T x 2 x 8, float>
// CHECK-NEXT:   %[[P:[A-Za-z_0-9]+]] = k3s.absent_tensor : !k3s.tensor<B x T x 2 x 16, float>
// CHECK-NEXT:   %[[QG:[A-Za-z_0-9]+]] = k3s.absent_tensor : !k3s.tensor<B x T x 2 x 8, float>
// CHECK-NEXT:   k3s.launch @kda_summary_prepare %[[Q]], %k, %v, %g, %beta, %cu_seqlens, %KG, %[[P]], %[[QG]], %U, %W, %gamma_C
// CHECK:        k3s.kernel @kda_segments_prepare <grid = [chunk, value_head], num_warps = 4, flags = {SPILL_P_QG = true}, shares_code_of = @kda_summary_prepare> {
// CHECK:        k3s.kernel @kda_segments_summary_scan_N <{{.*}}, shares_code_of = @kda_summary_scan_N> {
// CHECK:        k3s.kernel @kda_segments_summary_scan_M <{{.*}}, shares_code_of = @kda_summary_scan_M> {
// CHECK:        k3s.kernel @kda_segments_scan <grid = [value_block, sequence_head], num_warps = 4, num_stages = 2> {
// CHECK:      k3s.entry @chunk_segments <source = @kda> {
// CHECK:        k3s.kernel @kda_chunk_prepare <grid = [chunk, value_head], num_warps = 4, flags = {SPILL_P_QG = true}, shares_code_of = @kda_summary_prepare> {
// CHECK:        k3s.kernel @kda_chunk_scan <grid = [value_block, sequence_head], num_warps = 4, num_stages = 3, shares_code_of = @kda_segments_scan> {
// CHECK:      k3s.entry @chunk <source = @kda> {

// OWN:        k3s.kernel @kda_summary_prepare <grid = [chunk, value_head], num_warps = 4> {
// OWN-NOT:      k3s.when
// OWN:        k3s.kernel @kda_segments_prepare <grid = [chunk, value_head], num_warps = 4> {
// OWN:        k3s.kernel @kda_chunk_prepare <grid = [chunk, value_head], num_warps = 4, shares_code_of = @kda_segments_prepare> {
