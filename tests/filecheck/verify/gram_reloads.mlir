// k3s.gram with an elementwise diagonal reloads key rows and log-decays from memory: its last
// operands are the tensors the key and gate loads read (k, g, and A_log, dt_bias when the gate's
// input form reads them), after all its tiles; a Gram without that diagonal reads no tensor.
// RUN: k3c opt %s | filecheck %s --check-prefix=VALID
// RUN: sed 's/, %%beta_1, %%k, %%g </, %%beta_1 </' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=NONE
// RUN: sed 's/, %%beta_1, %%k, %%g </, %%beta_1, %%k </' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=ONE
// RUN: sed 's/%%kr, %%beta_1, %%k, %%g </%%kr, %%k, %%g, %%beta_1 </' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=ORDER
// RUN: sed 's/diagonal = elementwise/diagonal = factored/; s/%%kr, %%beta_1/%%kr, %%kl, %%beta_1/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=FACTORED
// A guarded diagonal reads the same tensors and, after its tiles, the chunk's span check.
// RUN: sed 's/diagonal = elementwise/diagonal = guarded/; s/%%kr, %%beta_1/%%kr, %%kl, %%beta_1/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=UNGUARDED

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
      %kl = k3s.block_rescale %k_1, %G, %Gstart <decay = row_over_reference> : !k3s.tile<C x K>
      %beta_1 = k3s.load_beta %beta <input = probability> : !k3s.tile<C>
      %A = k3s.gram %k_1, %k_1, %G, %Gstart, %Gend, %kl, %kr, %beta_1, %k, %g <mask = strict, gate = channel, beta = true, diagonal = elementwise> : !k3s.tile<C x C>
      k3s.spill %W, %A
    }
  }
}

// VALID: %A = k3s.gram %k_1, %k_1, %G, %Gstart, %Gend, %kl, %kr, %beta_1, %k, %g <mask = strict, gate = channel, beta = true, diagonal = elementwise> : !k3s.tile<C x C>

// NONE: {{^}}k3c opt: error: <stdin>: k3s.gram: an elementwise diagonal reads k and g (and A_log, dt_bias with an in-kernel gate), got 0 tensor operands{{$}}
// ONE: {{^}}k3c opt: error: <stdin>: k3s.gram: an elementwise diagonal reads k and g (and A_log, dt_bias with an in-kernel gate), got 1 tensor operands{{$}}
// ORDER: {{^}}k3c opt: error: <stdin>:{{[0-9]+}}:{{[0-9]+}}: k3s.gram: its operands are its tiles, then a guard, then tensors{{$}}
// UNGUARDED: {{^}}k3c opt: error: <stdin>: k3s.gram: a guarded diagonal (and only it) takes a k3s.block_span_check operand (factored_guard); got 0 with diagonal 'guarded'{{$}}
// FACTORED: {{^}}k3c opt: error: <stdin>: k3s.gram: only an elementwise or guarded diagonal reads tensors; got 2 with mask = strict, gate = channel, beta = true, diagonal = factored{{$}}
