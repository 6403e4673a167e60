// k3s.gram with a guarded diagonal: its diagonal factor among its tiles, then the chunk's
// k3s.block_span_check (an i1), then the tensors its elementwise blocks reload; the check's limit
// (nats of decay a block may span) is positive.
// RUN: k3c opt %s | filecheck %s --check-prefix=VALID
// RUN: k3c opt %s | k3c opt - | filecheck %s --check-prefix=VALID
// RUN: sed 's/%%beta_1, %%factorable, %%k, %%g </%%beta_1, %%k, %%g, %%factorable </' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=ORDER
// RUN: sed 's/%%kd, %%beta_1, %%factorable/%%beta_1, %%factorable/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=NOFACTOR
// RUN: sed 's/, %%factorable, %%k, %%g </, %%k, %%g </' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=NOGUARD
// RUN: sed 's/diagonal = guarded/diagonal = elementwise/; s/%%kr, %%kd, %%beta_1/%%kr, %%beta_1/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=ELEMENTWISE
// RUN: sed 's/limit = 80.0/limit = 0.0/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=LIMIT

builtin.module {
  k3.recurrence @r <gate = channel, delta_rule = true, num_heads = 2, num_v_heads = 2, head_k_dim = 8, head_v_dim = 4, scale = 0.25, state_layout = kv, dtype = float32>
  k3s.entry @chunk <source = @r> {
    %k = k3s.tensor_arg @k <role = input> : !k3s.tensor<B x T x 2 x 8, float>
    %g = k3s.tensor_arg @g <role = input> : !k3s.tensor<B x T x 2 x 8, float>
    %beta = k3s.tensor_arg @beta <role = input> : !k3s.tensor<B x T x 2, float>
    %W = k3s.tensor_arg @W <role = workspace> : !k3s.tensor<B x T x 2 x 16, float>
    k3s.kernel @r_chunk_prepare <grid = [chunk, value_head], num_warps = 4> {
      k3s.chunk_tile <chunk_size = 16, head_k_dim = 8, head_v_dim = 4>
      %k_1 = k3s.load_chunk %k : !k3s.tile<C x K>
      %g_1 = k3s.load_gate %g <gate = channel, input = log, lower_bound = -5.0> : !k3s.tile<C x K>
      %G = k3s.gate_cumsum %g_1 <gate = channel> : !k3s.tile<C x K>
      %Gstart, %Gend = k3s.block_gates %G <sub_chunk = 4> : !k3s.tile<NB x K>, !k3s.tile<NB x K>
      %kr = k3s.block_rescale %k_1, %G, %Gend <decay = reference_over_row> : !k3s.tile<C x K>
      %kd = k3s.block_rescale %k_1, %G, %Gstart <decay = reference_over_row> : !k3s.tile<C x K>
      %factorable = k3s.block_span_check %Gstart, %Gend <limit = 80.0> : i1
      %kl = k3s.block_rescale %k_1, %G, %Gstart <decay = row_over_reference> : !k3s.tile<C x K>
      %beta_1 = k3s.load_beta %beta <input = probability> : !k3s.tile<C>
      %A = k3s.gram %k_1, %k_1, %G, %Gstart, %Gend, %kl, %kr, %kd, %beta_1, %factorable, %k, %g <mask = strict, gate = channel, beta = true, diagonal = guarded> : !k3s.tile<C x C>
      k3s.spill %W, %A
    }
  }
}

// VALID: %factorable = k3s.block_span_check %Gstart, %Gend <limit = 80.0> : i1
// VALID: %A = k3s.gram %k_1, %k_1, %G, %Gstart, %Gend, %kl, %kr, %kd, %beta_1, %factorable, %k, %g <mask = strict, gate = channel, beta = true, diagonal = guarded> : !k3s.tile<C x C>

// ORDER: {{^}}k3c opt: error: <stdin>:{{[0-9]+}}:{{[0-9]+}}: k3s.gram: its operands are its tiles, then a guard, then tensors{{$}}
// NOFACTOR: {{^}}k3c opt: error: <stdin>:{{[0-9]+}}:{{[0-9]+}}: k3s.gram: its properties take 9 tile operands (lhs, keys, cumulative_gate, gate_start, gate_end, left_factor, right_factor, diagonal_factor, row_scale), got 8{{$}}
// NOGUARD: {{^}}k3c opt: error: <stdin>: k3s.gram: a guarded diagonal (and only it) takes a k3s.block_span_check operand (factored_guard); got 0 with diagonal 'guarded'{{$}}
// ELEMENTWISE: {{^}}k3c opt: error: <stdin>: k3s.gram: a guarded diagonal (and only it) takes a k3s.block_span_check operand (factored_guard); got 1 with diagonal 'elementwise'{{$}}
// LIMIT: {{^}}k3c opt: error: <stdin>: k3s.block_span_check: limit must be positive, got 0.0{{$}}
