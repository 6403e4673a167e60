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
// CHECK-NEXT: k3s.entry @kda_segment_scan <source = @kda> {
// CHECK-NEXT:   %[[Q:[A-Za-z_0-9]+]] = k3s.tensor_arg @q
// CHECK-NEXT:   %[[K:[A-Za-z_0-9]+]] = k3s.tensor_arg @k
// CHECK-NEXT:   %[[V:[A-Za-z_0-9]+]] = k3s.tensor_arg @v
// CHECK-NEXT:   %[[G:[A-Za-z_0-9]+]] = k3s.tensor_arg @g
// CHECK-NEXT:   %[[BETA:[A-Za-z_0-9]+]] = k3s.tensor_arg @beta
// CHECK-NEXT:   %[[SCALE:[A-Za-z_0-9]+]] = k3s.scalar_arg @scale
// CHECK-NEXT:   %initial_state = k3s.tensor_arg @initial_state <role = optional_input> : !k3s.tensor<N x 2 x 8 x 8, float32>
// CHECK-NEXT:   %[[O:[A-Za-z_0-9]+]] = k3s.tensor_arg @o
// CHECK:        k3s.segment_scan {
// CHECK-NEXT:     k3s.segment_summary <transition = full>
// CHECK-NEXT:     k3s.summary_combine <transition = full>
// CHECK-NEXT:     k3s.chunked <chunk_size = 16> {
// CHECK-NEXT:       %[[q:[a-z_0-9]+]] = k3s.load_chunk %[[Q]] : !k3s.tile<C x K>
// CHECK-NEXT:       %[[k:[a-z_0-9]+]] = k3s.load_chunk %[[K]] : !k3s.tile<C x K>
// CHECK-NEXT:       %[[v:[a-z_0-9]+]] = k3s.load_chunk %[[V]] : !k3s.tile<C x V>
// CHECK-NEXT:       %[[g:[a-z_0-9]+]] = k3s.load_gate %[[G]] <gate = channel, input = log, lower_bound = -5.0, floor = -110.0> : !k3s.tile<C x K>
// CHECK-NEXT:       %G = k3s.gate_cumsum %[[g]] <gate = channel> : !k3s.tile<C x K>
// CHECK-NEXT:       %Glast = k3s.gate_total %G <gate = channel> : !k3s.tile<K>
// CHECK-NEXT:       %Gstart, %Gend = k3s.block_gates %G <sub_chunk = 16> : !k3s.tile<NB x K>, !k3s.tile<NB x K>
// CHECK-NEXT:       %kr = k3s.block_rescale %[[k]], %G, %Gend <decay = reference_over_row> : !k3s.tile<C x K>
// CHECK-NEXT:       %kd = k3s.block_rescale %[[k]], %G, %Gstart <decay = reference_over_row> : !k3s.tile<C x K>
// an unbounded gate's chunks factor their Grams' diagonal blocks where the span check holds
// CHECK-NEXT:       %factorable = k3s.block_span_check %Gstart, %Gend <limit = 80.0> : i1
// CHECK-NEXT:       %[[beta:[a-z_0-9]+]] = k3s.load_beta %[[BETA]] <input = probability> : !k3s.tile<C>
// CHECK-NEXT:       %kl = k3s.block_rescale %[[k]], %G, %Gstart <decay = row_over_reference> : !k3s.tile<C x K>
// and elsewhere reload the rows of their diagonal blocks from k and g
// CHECK-NEXT:       %A = k3s.gram %[[k]], %[[k]], %G, %Gstart, %Gend, %kl, %kr, %kd, %[[beta]], %factorable, %[[K]], %[[G]] <mask = strict, gate = channel, beta = true, diagonal = guarded>
// CHECK:            %QG = k3s.gate_apply %[[q]], %G <anchor = start, gate = channel> : !k3s.tile<C x K>
// CHECK-NEXT:       %KG = k3s.gate_apply %[[k]], %G, %Glast <anchor = end, gate = channel> : !k3s.tile<C x K>
// CHECK-NEXT:       %gamma_C = k3s.chunk_decay %Glast <gate = channel> : !k3s.tile<K>
// CHECK-NEXT:       k3s.chunk_scan {
// CHECK-NEXT:       ^bb0(%S: !k3s.tile<K x V>):
// CHECK-NEXT:         %vr = k3s.delta_residual %S, %W, %U : !k3s.tile<C x V>
// CHECK-NEXT:         %{{[a-z_0-9]+}} = k3s.chunk_output %QG, %S, %P, %vr, %[[O]], %[[SCALE]] : !k3s.tile<C x V>
// CHECK-NEXT:         %S_1 = k3s.state_advance %S, %KG, %vr, %gamma_C <gate = channel> : !k3s.tile<K x V>
// CHECK-NEXT:         k3s.next_chunk %S_1
// CHECK:      k3.recurrence @gdn
// CHECK-NEXT: k3s.entry @gdn_segment_scan <source = @gdn> {
// CHECK:        %{{[A-Za-z_0-9]+}} = k3s.tensor_arg @initial_state <role = optional_input> : !k3s.tensor<N x 4 x 8 x 8, float32>
// CHECK:        k3s.segment_summary <transition = full>
// CHECK-NEXT:   k3s.summary_combine <transition = full>
// CHECK:          %[[g2:[a-z_0-9]+]] = k3s.load_gate
// CHECK-NEXT:     %G = k3s.gate_cumsum %[[g2]] <gate = scalar> : !k3s.tile<C>
// CHECK:      k3.recurrence @dn
// CHECK:        %[[Q3:[A-Za-z_0-9]+]] = k3s.tensor_arg @q
// CHECK-NEXT:   %[[K3:[A-Za-z_0-9]+]] = k3s.tensor_arg @k
// CHECK-NEXT:   %[[V3:[A-Za-z_0-9]+]] = k3s.tensor_arg @v
// CHECK-NEXT:   %{{[A-Za-z_0-9]+}} = k3s.tensor_arg @g
// CHECK-NEXT:   %[[BETA3:[A-Za-z_0-9]+]] = k3s.tensor_arg @beta
// CHECK:        k3s.segment_summary <transition = full>
// CHECK-NEXT:   k3s.summary_combine <transition = full>
// CHECK-NEXT:   k3s.chunked <chunk_size = 16> {
// CHECK-NEXT:     %[[q3:[a-z_0-9]+]] = k3s.load_chunk %[[Q3]] : !k3s.tile<C x K>
// CHECK-NEXT:     %[[k3:[a-z_0-9]+]] = k3s.load_chunk %[[K3]] : !k3s.tile<C x K>
// CHECK-NEXT:     %[[v3:[a-z_0-9]+]] = k3s.load_chunk %[[V3]] : !k3s.tile<C x V>
// CHECK-NEXT:     %[[beta3:[a-z_0-9]+]] = k3s.load_beta %[[BETA3]] <input = probability> : !k3s.tile<C>
// CHECK-NEXT:     %A = k3s.gram %[[k3]], %[[k3]], %[[beta3]] <mask = strict, gate = none, beta = true
// CHECK:      k3.recurrence @gla
// CHECK:        %{{[A-Za-z_0-9]+}} = k3s.tensor_arg @beta <role = forbidden> : !k3s.tensor<B x T x 2, float>
// CHECK:        k3s.segment_summary <transition = diagonal>
// CHECK-NEXT:   k3s.summary_combine <transition = diagonal>
// CHECK-NOT:    k3s.delta_residual
// CHECK:      k3.recurrence @sgla
// CHECK:        k3s.segment_summary <transition = scalar>
// CHECK-NEXT:   k3s.summary_combine <transition = scalar>
// CHECK:      k3.recurrence @linear
// CHECK:        %[[Q6:[A-Za-z_0-9]+]] = k3s.tensor_arg @q
// CHECK-NEXT:   %[[K6:[A-Za-z_0-9]+]] = k3s.tensor_arg @k
// CHECK-NEXT:   %[[V6:[A-Za-z_0-9]+]] = k3s.tensor_arg @v
// CHECK:        %[[SCALE6:[A-Za-z_0-9]+]] = k3s.scalar_arg @scale
// CHECK:        %[[O6:[A-Za-z_0-9]+]] = k3s.tensor_arg @o
// CHECK:        k3s.segment_summary <transition = identity>
// CHECK-NEXT:   k3s.summary_combine <transition = identity>
// CHECK-NEXT:   k3s.chunked <chunk_size = 16> {
// CHECK-NEXT:     %[[q6:[a-z_0-9]+]] = k3s.load_chunk %[[Q6]] : !k3s.tile<C x K>
// CHECK-NEXT:     %[[k6:[a-z_0-9]+]] = k3s.load_chunk %[[K6]] : !k3s.tile<C x K>
// CHECK-NEXT:     %[[v6:[a-z_0-9]+]] = k3s.load_chunk %[[V6]] : !k3s.tile<C x V>
// CHECK-NEXT:     %P = k3s.gram %[[q6]], %[[k6]] <mask = inclusive, gate = none, beta = false
// CHECK-NEXT:     k3s.chunk_scan {
// CHECK-NEXT:     ^bb0(%S: !k3s.tile<K x V>):
// CHECK-NEXT:       %{{[a-z_0-9]+}} = k3s.chunk_output %[[q6]], %S, %P, %[[v6]], %[[O6]], %[[SCALE6]] : !k3s.tile<C x V>
// CHECK-NEXT:       %S_1 = k3s.state_advance %S, %[[k6]], %[[v6]] <gate = none> : !k3s.tile<K x V>
// CHECK-NEXT:       k3s.next_chunk %S_1

// SPEC-LABEL: // -----// IR after derive-segment-scan //----- //
// SPEC:       k3s.entry @segment_scan <source = @gla> {
// SPEC:         k3s.segment_scan {
// SPEC-NEXT:      k3s.segment_summary <transition = diagonal>
// SPEC-NEXT:      k3s.summary_combine <transition = diagonal>
// SPEC-NEXT:      k3s.chunked <chunk_size = 16> {

// ZERO-NOT: {{\n}}
// ZERO: {{^}}k3c opt: error: pipeline 'derive-segment-scan{chunk-size=0}': derive-segment-scan: chunk-size and sub-chunk must be positive, got 0, 16{{$}}
// ZERO-NOT: {{.}}
