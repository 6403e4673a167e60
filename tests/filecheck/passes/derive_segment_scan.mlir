// derive-segment-scan: the form of a segment's transition M follows from the op. The delta rule
// gives a full K x K M (its rank-one corrections mix the key channels), a channel gate alone a
// diagonal one, a scalar gate alone a scalar, and neither an identity (no M: summaries add).
// Summary and combine share the form; the derived chunk schedule finishes every segment.
// RUN: k3c opt %s -p 'derive-segment-scan{chunk-size=16}' | filecheck %s
// RUN: k3c opt %s -p 'derive-segment-scan{chunk-size=16}' | k3c opt - | filecheck %s
// From a spec, after its passes: `k3c ir --after-all` shows the segment scan.
// RUN: k3c ir %examples/gla.toml --after-all -p derive-segment-scan | filecheck %s --check-prefix=SPEC
// Bad options are one-line errors.
// RUN: not k3c opt %s -p 'derive-segment-scan{chunk-size=0}' 2>&1 | filecheck %s --check-prefix=ZERO

builtin.module {
  k3.recurrence @kda <gate = channel, delta_rule = true, num_heads = 2, num_v_heads = 2, head_k_dim = 8, head_v_dim = 8, scale = 0.5, state_layout = kv, dtype = float32>
  k3.recurrence @gdn <gate = scalar, delta_rule = true, num_heads = 2, num_v_heads = 4, head_k_dim = 8, head_v_dim = 8, scale = 0.5, state_layout = vk, dtype = float32>
  k3.recurrence @dn <gate = none, delta_rule = true, num_heads = 2, num_v_heads = 2, head_k_dim = 8, head_v_dim = 8, scale = 0.5, state_layout = kv, dtype = float32>
  k3.recurrence @gla <gate = channel, delta_rule = false, num_heads = 2, num_v_heads = 2, head_k_dim = 8, head_v_dim = 8, scale = 0.5, state_layout = kv, dtype = float32>
  k3.recurrence @sgla <gate = scalar, delta_rule = false, num_heads = 2, num_v_heads = 2, head_k_dim = 8, head_v_dim = 8, scale = 0.5, state_layout = kv, dtype = float32>
  k3.recurrence @linear <gate = none, delta_rule = false, num_heads = 2, num_v_heads = 2, head_k_dim = 8, head_v_dim = 8, scale = 0.5, state_layout = kv, dtype = float32>
}

// CHECK:      k3.recurrence @kda
// CHECK-NEXT: k3s.entry @kda_segment_scan <source = kda> {
// CHECK:        k3s.tensor_arg @initial_state <shape = "N,2,8,8", dtype = float32, role = optional_input>
// CHECK:        k3s.segment_scan {
// CHECK-NEXT:     k3s.segment_summary <transition = full>
// CHECK-NEXT:     k3s.summary_combine <transition = full>
// CHECK-NEXT:     k3s.chunked <chunk_size = 16> {
// CHECK-NEXT:       k3s.chunk_local {
// CHECK-NEXT:         k3s.gate_cumsum <gate = channel>
// CHECK-NEXT:         k3s.gram <lhs = k, mask = strict, gate = channel, beta = true
// CHECK:            k3s.chunk_scan {
// CHECK-NEXT:         k3s.delta_residual
// CHECK-NEXT:         k3s.chunk_output <gate = channel, residual = true>
// CHECK-NEXT:         k3s.state_advance <gate = channel, residual = true>
// CHECK:      k3.recurrence @gdn
// CHECK-NEXT: k3s.entry @gdn_segment_scan <source = gdn> {
// CHECK:        k3s.tensor_arg @initial_state <shape = "N,4,8,8", dtype = float32, role = optional_input>
// CHECK:        k3s.segment_summary <transition = full>
// CHECK-NEXT:   k3s.summary_combine <transition = full>
// CHECK:          k3s.gate_cumsum <gate = scalar>
// CHECK:      k3.recurrence @dn
// CHECK:        k3s.segment_summary <transition = full>
// CHECK-NEXT:   k3s.summary_combine <transition = full>
// CHECK-NEXT:   k3s.chunked <chunk_size = 16> {
// CHECK-NEXT:     k3s.chunk_local {
// CHECK-NEXT:       k3s.gram <lhs = k, mask = strict, gate = none, beta = true
// CHECK:      k3.recurrence @gla
// CHECK:        k3s.tensor_arg @beta <shape = "B,T,2", dtype = float, role = forbidden>
// CHECK:        k3s.segment_summary <transition = diagonal>
// CHECK-NEXT:   k3s.summary_combine <transition = diagonal>
// CHECK-NOT:    k3s.delta_residual
// CHECK:      k3.recurrence @sgla
// CHECK:        k3s.segment_summary <transition = scalar>
// CHECK-NEXT:   k3s.summary_combine <transition = scalar>
// CHECK:      k3.recurrence @linear
// CHECK:        k3s.segment_summary <transition = identity>
// CHECK-NEXT:   k3s.summary_combine <transition = identity>
// CHECK-NEXT:   k3s.chunked <chunk_size = 16> {
// CHECK-NEXT:     k3s.chunk_local {
// CHECK-NEXT:       k3s.gram <lhs = q, mask = inclusive, gate = none, beta = false
// CHECK-NEXT:     }
// CHECK-NEXT:     k3s.chunk_scan {
// CHECK-NEXT:       k3s.chunk_output <gate = none, residual = false>
// CHECK-NEXT:       k3s.state_advance <gate = none, residual = false>

// SPEC-LABEL: // -----// IR after derive-segment-scan //----- //
// SPEC:       k3s.entry @segment_scan <source = gla> {
// SPEC:         k3s.segment_scan {
// SPEC-NEXT:      k3s.segment_summary <transition = diagonal>
// SPEC-NEXT:      k3s.summary_combine <transition = diagonal>
// SPEC-NEXT:      k3s.chunked <chunk_size = 16> {

// ZERO-NOT: {{\n}}
// ZERO: {{^}}k3c opt: error: pipeline 'derive-segment-scan{chunk-size=0}': derive-segment-scan: chunk-size and sub-chunk must be positive, got 0, 16{{$}}
// ZERO-NOT: {{.}}
