// The segment scan's verifiers: its body is a summary, a combine and the chunked schedule that
// finishes the segments, in that order; summary and combine hold M in the same form, one of
// full, diagonal, scalar, identity; summary and combine live only in a segment scan. The combine
// takes no tensors there; lowered to a host step of an entry, it takes the entry's M (but for the
// identity transition), N and the entering states it makes.
// RUN: k3c opt %s | filecheck %s --check-prefix=VALID
// RUN: sed 's/summary_combine <transition = full>/summary_combine <transition = diagonal>/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=DISAGREE
// RUN: sed 's/transition = full/transition = dense/g' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=FORM
// RUN: sed '/k3s.summary_combine/d' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=MISSING
// RUN: sed 's/^      k3s.segment_summary <transition = full>$/      k3s.summary_combine <transition = full>/; t; s/^      k3s.summary_combine <transition = full>$/      k3s.segment_summary <transition = full>/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=ORDER
// RUN: sed 's/^  k3s.entry @segment_scan <source = @r> {$/  k3s.segment_summary <transition = full>\n&/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=PARENT
// RUN: sed 's/^      k3s.summary_combine <transition = full>$/      k3s.summary_combine %%summaries <transition = full>/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=SCHEDULE_TENSORS
// RUN: sed 's/k3s.summary_combine %%M, %%N, %%initial_state/k3s.summary_combine %%N, %%initial_state/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=HOST_TENSORS
// RUN: sed 's/k3s.summary_combine %%M, %%N, %%initial_state <transition = full>/k3s.summary_combine %%N, %%initial_state <transition = identity>/' %s | k3c opt - | filecheck %s --check-prefix=IDENTITY

builtin.module {
  k3.recurrence @r <gate = channel, delta_rule = true, num_heads = 2, num_v_heads = 2, head_k_dim = 8, head_v_dim = 4, scale = 0.25, state_layout = kv, dtype = float32>
  k3s.entry @segment_scan <source = @r> {
    %summaries = k3s.tensor_arg @summaries <role = workspace> : !k3s.tensor<N x 2 x 8 x 4, float32>
    %k = k3s.tensor_arg @k <role = input> : !k3s.tensor<B x T x 2 x 8, float>
    %v = k3s.tensor_arg @v <role = input> : !k3s.tensor<B x T x 2 x 4, float>
    %g = k3s.tensor_arg @g <role = input> : !k3s.tensor<B x T x 2 x 8, float>
    %beta = k3s.tensor_arg @beta <role = input> : !k3s.tensor<B x T x 2, float>
    k3s.segment_scan {
      k3s.segment_summary <transition = full>
      k3s.summary_combine <transition = full>
      k3s.chunked <chunk_size = 4> {
        %k_1 = k3s.load_chunk %k : !k3s.tile<C x K>
        %v_1 = k3s.load_chunk %v : !k3s.tile<C x V>
        %g_1 = k3s.load_gate %g <gate = channel, input = log, lower_bound = -5.0> : !k3s.tile<C x K>
        %G = k3s.gate_cumsum %g_1 <gate = channel> : !k3s.tile<C x K>
        %Glast = k3s.gate_total %G <gate = channel> : !k3s.tile<K>
        %Gstart, %Gend = k3s.block_gates %G <sub_chunk = 4> : !k3s.tile<NB x K>, !k3s.tile<NB x K>
        %kr = k3s.block_rescale %k_1, %G, %Gend <decay = reference_over_row> : !k3s.tile<C x K>
        %kl = k3s.block_rescale %k_1, %G, %Gstart <decay = row_over_reference> : !k3s.tile<C x K>
        %beta_1 = k3s.load_beta %beta <input = probability> : !k3s.tile<C>
        %A = k3s.gram %k_1, %k_1, %G, %Gstart, %Gend, %kl, %kr, %beta_1, %k, %g <mask = strict, gate = channel, beta = true, diagonal = elementwise> : !k3s.tile<C x C>
        %T = k3s.forward_substitution %A, %beta_1 <block = 1> : !k3s.tile<C x C>
        %W = k3s.wy_apply %T, %k_1, %G <gate = channel> : !k3s.tile<C x K>
        %U = k3s.wy_apply %T, %v_1 <gate = none> : !k3s.tile<C x V>
        %KG = k3s.gate_apply %k_1, %G, %Glast <anchor = end, gate = channel> : !k3s.tile<C x K>
        %gamma_C = k3s.chunk_decay %Glast <gate = channel> : !k3s.tile<K>
        k3s.chunk_scan {
        ^bb0(%S: !k3s.tile<K x V>):
          %vr = k3s.delta_residual %S, %W, %U : !k3s.tile<C x V>
          %S_1 = k3s.state_advance %S, %KG, %vr, %gamma_C <gate = channel> : !k3s.tile<K x V>
          k3s.next_chunk %S_1
        }
      }
    }
  }
  k3s.entry @chunk_segments <source = @r> {
    %initial_state = k3s.tensor_arg @initial_state <role = combined> : !k3s.tensor<N x 2 x 8 x 4, float32>
    %M = k3s.tensor_arg @M <role = workspace> : !k3s.tensor<N x 2 x 8 x 8, float32>
    %N = k3s.tensor_arg @N <role = workspace> : !k3s.tensor<N x 2 x 8 x 4, float32>
    k3s.summary_combine %M, %N, %initial_state <transition = full>
  }
}

// VALID: k3s.segment_summary <transition = full>
// VALID: k3s.summary_combine %M, %N, %initial_state <transition = full>

// DISAGREE-NOT: {{\n}}
// DISAGREE: {{^}}k3c opt: error: <stdin>: k3s.segment_scan: summary and combine disagree on the transition form (full vs diagonal){{$}}
// DISAGREE-NOT: {{.}}

// FORM-NOT: {{\n}}
// FORM: {{^}}k3c opt: error: <stdin>:{{[0-9]+}}:{{[0-9]+}}: k3s.segment_summary: property 'transition' must be one of full, diagonal, scalar, identity; got dense{{$}}
// FORM-NOT: {{.}}

// MISSING-NOT: {{\n}}
// MISSING: {{^}}k3c opt: error: <stdin>: k3s.segment_scan: body must be segment_summary, summary_combine, chunked; got k3s.segment_summary, k3s.chunked{{$}}
// MISSING-NOT: {{.}}

// ORDER-NOT: {{\n}}
// ORDER: {{^}}k3c opt: error: <stdin>: k3s.segment_scan: body must be segment_summary, summary_combine, chunked; got k3s.summary_combine, k3s.segment_summary, k3s.chunked{{$}}
// ORDER-NOT: {{.}}

// PARENT-NOT: {{\n}}
// PARENT: {{^}}k3c opt: error: <stdin>: 'k3s.segment_summary' expects parent op 'k3s.segment_scan'{{$}}
// PARENT-NOT: {{.}}

// SCHEDULE_TENSORS-NOT: {{\n}}
// SCHEDULE_TENSORS: {{^}}k3c opt: error: <stdin>: k3s.summary_combine <transition = full>: takes no tensors (in a segment scan), got 1 operands{{$}}
// SCHEDULE_TENSORS-NOT: {{.}}

// HOST_TENSORS-NOT: {{\n}}
// HOST_TENSORS: {{^}}k3c opt: error: <stdin>: k3s.summary_combine <transition = full>: takes M, N and the entering states, got 2 operands{{$}}
// HOST_TENSORS-NOT: {{.}}

// IDENTITY: k3s.summary_combine %N, %initial_state <transition = identity>
