// merge-identical-kernels: a kernel whose body and code properties equal those of an earlier
// kernel of another entry runs that kernel's code (shares_code_of); launch settings (warps,
// stages, block sizes) may differ. The chunk entry and chunk_segments share their prepare and
// scan, segment_summary and chunk_segments their summary scans; segment_summary's prepare has no
// query Gram, so it keeps its own code. Running the pass again changes nothing.
// RUN: k3c opt %s -p 'derive-segment-scan{chunk-size=16},lower-segment-scan{block-v=8},derive-chunkwise{chunk-size=16},fuse-chunkwise{block-v=8},merge-identical-kernels' | filecheck %s
// RUN: k3c opt %s -p 'derive-segment-scan{chunk-size=16},lower-segment-scan{block-v=8},derive-chunkwise{chunk-size=16},fuse-chunkwise{block-v=8},merge-identical-kernels,merge-identical-kernels' | k3c opt - | filecheck %s

builtin.module {
  k3.recurrence @kda <gate = channel, delta_rule = true, num_heads = 2, num_v_heads = 2, head_k_dim = 8, head_v_dim = 4, scale = 0.5, state_layout = kv, dtype = float32>
}

// CHECK:      k3s.entry @segment_summary <source = kda> {
// CHECK:        k3s.kernel @kda_summary_prepare <grid = "chunk,value_head", num_warps = 4> {
// CHECK:        k3s.kernel @kda_summary_scan_N <grid = "value_block,sequence_head", num_warps = 4, num_stages = 2> {
// CHECK:        k3s.kernel @kda_summary_scan_M <grid = "value_block,sequence_head", num_warps = 4, num_stages = 2> {
// CHECK:      k3s.entry @chunk_segments <source = kda> {
// CHECK:        k3s.kernel @kda_segments_prepare <grid = "chunk,value_head", num_warps = 4> {
// CHECK:        k3s.kernel @kda_segments_summary_scan_N <{{.*}}, shares_code_of = kda_summary_scan_N> {
// CHECK:        k3s.kernel @kda_segments_summary_scan_M <{{.*}}, shares_code_of = kda_summary_scan_M> {
// CHECK:        k3s.kernel @kda_segments_scan <grid = "value_block,sequence_head", num_warps = 4, num_stages = 2> {
// CHECK:      k3s.entry @chunk <source = kda> {
// CHECK:        k3s.kernel @kda_chunk_prepare <grid = "chunk,value_head", num_warps = 4, shares_code_of = kda_segments_prepare> {
// CHECK:        k3s.kernel @kda_chunk_scan <grid = "value_block,sequence_head", num_warps = 4, num_stages = 3, shares_code_of = kda_segments_scan> {
