// k3s load stages that carry what their input means: l2norm applies to q and k only (rows of
// key channels, on load_token and load_chunk), load_gate's gate and input and load_beta's input
// take their listed values, and both need their properties; load_gate reads A_log and dt_bias
// after g exactly when its input form computes the gate from them. Each error is one line
// naming the op.
// RUN: k3c opt %s | filecheck %s --check-prefix=VALID
// RUN: sed 's/load_token %%v :/load_token %%v <l2norm = true> :/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=TOKENV
// RUN: sed 's/load_chunk %%v :/load_chunk %%v <l2norm = true> :/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=CHUNKV
// RUN: sed 's/input = bounded/input = exp/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=GATEINPUT
// RUN: sed 's/<gate = channel, input = bounded/<gate = none, input = bounded/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=GATENONE
// RUN: sed 's/<input = logits>/<input = sigmoid>/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=BETAINPUT
// RUN: sed 's/, lower_bound = -3.0//' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=NOBOUND
// RUN: sed 's/ <input = logits>//' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=NOBETAINPUT
// RUN: sed 's/load_token %%q <l2norm = true>/load_token %%q <l2norm = 1>/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=L2BOOL
// l2norm = false on v is the default written out, not a normalisation, so it verifies.
// RUN: sed 's/load_token %%v :/load_token %%v <l2norm = false> :/' %s | k3c opt - | filecheck %s --check-prefix=VFALSE
// RUN: sed 's/lower_bound = -3.0/lower_bound = 2.0/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=POSBOUND
// RUN: sed 's/load_gate %%g, %%A_log, %%dt_bias/load_gate %%g/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=NOPARAMS
// RUN: sed 's/input = bounded/input = log/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=EXTRAPARAMS

builtin.module {
  k3.recurrence @r <gate = channel, delta_rule = true, num_heads = 2, num_v_heads = 2, head_k_dim = 16, head_v_dim = 16, scale = 0.25, state_layout = kv, dtype = float32>
  k3s.entry @recurrent <source = @r> {
    %q = k3s.tensor_arg @q <role = input> : !k3s.tensor<B x T x 2 x 16, float>
    %k = k3s.tensor_arg @k <role = input> : !k3s.tensor<B x T x 2 x 16, float>
    %v = k3s.tensor_arg @v <role = input> : !k3s.tensor<B x T x 2 x 16, float>
    %g = k3s.tensor_arg @g <role = input> : !k3s.tensor<B x T x 2 x 16, float>
    %beta = k3s.tensor_arg @beta <role = input> : !k3s.tensor<B x T x 2, float>
    %scale = k3s.scalar_arg @scale <default = 0.25> : f32
    %o = k3s.tensor_arg @o <role = output> : !k3s.tensor<B x T x 2 x 16, float>
    %A_log = k3s.tensor_arg @A_log <role = input> : !k3s.tensor<2, float>
    %dt_bias = k3s.tensor_arg @dt_bias <role = input> : !k3s.tensor<32, float>
    k3s.kernel @r_recurrent <grid = [value_block, sequence_head], num_warps = 4> {
      %S0 = k3s.state_tile <head_k_dim = 16, head_v_dim = 16, block_v = 16, layout = kv, start = zero> : !k3s.tile<K x V>
      %S_final = k3s.token_loop %S0 {
      ^bb0(%S: !k3s.tile<K x V>):
        %q_1 = k3s.load_token %q <l2norm = true> : !k3s.tile<K>
        %k_1 = k3s.load_token %k <l2norm = true> : !k3s.tile<K>
        %v_1 = k3s.load_token %v : !k3s.tile<V>
        %g_1 = k3s.load_gate %g, %A_log, %dt_bias <gate = channel, input = bounded, lower_bound = -3.0> : !k3s.tile<K>
        %S_1 = k3s.decay %S, %g_1 <gate = channel> : !k3s.tile<K x V>
        %beta_1 = k3s.load_beta %beta <input = logits> : !k3s.tile<>
        %v_2 = k3s.delta_correct %S_1, %k_1, %v_1, %beta_1 : !k3s.tile<V>
        %S_2 = k3s.rank1_update %S_1, %k_1, %v_2 : !k3s.tile<K x V>
        %o_1 = k3s.readout %S_2, %q_1, %o, %scale : !k3s.tile<V>
        k3s.next_token %S_2
      } : !k3s.tile<K x V>
    }
    k3s.kernel @r_chunk_prepare <grid = [chunk, value_head], num_warps = 4> {
      k3s.chunk_tile <chunk_size = 16, head_k_dim = 16, head_v_dim = 16>
      %k_2 = k3s.load_chunk %k <l2norm = true> : !k3s.tile<C x K>
      %v_3 = k3s.load_chunk %v : !k3s.tile<C x V>
    }
  }
}

// VALID:      %q_1 = k3s.load_token %q <l2norm = true> : !k3s.tile<K>
// VALID-NEXT: %k_1 = k3s.load_token %k <l2norm = true> : !k3s.tile<K>
// VALID-NEXT: %v_1 = k3s.load_token %v : !k3s.tile<V>
// VALID-NEXT: %g_1 = k3s.load_gate %g, %A_log, %dt_bias <gate = channel, input = bounded, lower_bound = -3.0> : !k3s.tile<K>
// VALID-NEXT: %S_1 = k3s.decay %S, %g_1 <gate = channel> : !k3s.tile<K x V>
// VALID-NEXT: %beta_1 = k3s.load_beta %beta <input = logits> : !k3s.tile<>
// VALID:      %k_1 = k3s.load_chunk %k <l2norm = true> : !k3s.tile<C x K>
// VALID-NEXT: %v_1 = k3s.load_chunk %v : !k3s.tile<C x V>

// TOKENV-NOT: {{\n}}
// TOKENV: {{^}}k3c opt: error: <stdin>: k3s.load_token: l2norm applies to q and k only (rows of key channels), not to values{{$}}
// TOKENV-NOT: {{.}}

// CHUNKV-NOT: {{\n}}
// CHUNKV: {{^}}k3c opt: error: <stdin>: k3s.load_chunk: l2norm applies to q and k only (rows of key channels), not to values{{$}}
// CHUNKV-NOT: {{.}}

// GATEINPUT-NOT: {{\n}}
// GATEINPUT: {{^}}k3c opt: error: <stdin>:{{[0-9]+}}:{{[0-9]+}}: k3s.load_gate: property 'input' must be one of log, clamped, softplus, bounded; got exp{{$}}
// GATEINPUT-NOT: {{.}}

// GATENONE-NOT: {{\n}}
// GATENONE: {{^}}k3c opt: error: <stdin>:{{[0-9]+}}:{{[0-9]+}}: k3s.load_gate: property 'gate' must be one of channel, scalar; got none{{$}}
// GATENONE-NOT: {{.}}

// BETAINPUT-NOT: {{\n}}
// BETAINPUT: {{^}}k3c opt: error: <stdin>:{{[0-9]+}}:{{[0-9]+}}: k3s.load_beta: property 'input' must be one of probability, logits, logits_neg_eigval; got sigmoid{{$}}
// BETAINPUT-NOT: {{.}}

// NOBOUND-NOT: {{\n}}
// NOBOUND: {{^}}k3c opt: error: <stdin>: {{.*}}'lower_bound'{{.*}}k3s.load_gate{{.*$}}
// NOBOUND-NOT: {{.}}

// NOBETAINPUT-NOT: {{\n}}
// NOBETAINPUT: {{^}}k3c opt: error: <stdin>: {{.*}}'input'{{.*}}k3s.load_beta{{.*$}}
// NOBETAINPUT-NOT: {{.}}

// L2BOOL-NOT: {{\n}}
// L2BOOL: {{^}}k3c opt: error: <stdin>:{{[0-9]+}}:{{[0-9]+}}: k3s.load_token: property 'l2norm' expects true or false, got 1{{$}}
// L2BOOL-NOT: {{.}}

// VFALSE: %v_1 = k3s.load_token %v <l2norm = false> : !k3s.tile<V>

// POSBOUND: {{^}}k3c opt: error: <stdin>: k3s.load_gate: lower_bound must be < 0, got 2.0{{$}}

// NOPARAMS: {{^}}k3c opt: error: <stdin>: k3s.load_gate: input bounded reads 2 gate parameters (A_log, dt_bias) after g, got 0{{$}}

// EXTRAPARAMS: {{^}}k3c opt: error: <stdin>: k3s.load_gate: input log reads 0 gate parameters (A_log, dt_bias) after g, got 2{{$}}
