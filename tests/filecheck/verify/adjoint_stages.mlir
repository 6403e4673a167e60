// The adjoint stages of a backward schedule (ir/k3s/adjoint.py) verify their tiles' dimensions:
// a product contracts matching dimensions (after its transposes) into the outer ones, a scaling's
// factor runs along what it says (rows: one per row; columns: one per column; all: one number, a
// `<>` tile or the entry's f32 scale), and a cotangent's store takes gradient tensors and the
// inputs they are of, pair by pair, each d<input>, the first input its own; the triangular inverse
// is a chunk's [C, C]. Each refusal is one line.
// RUN: k3c opt %s | filecheck %s --check-prefix=VALID
// RUN: k3c opt %s | k3c opt - | filecheck %s --check-prefix=VALID
// RUN: sed 's/%%P_bar = k3s.dot %%do_1, %%do_1 <transpose_rhs = true>/%%P_bar = k3s.dot %%do_1, %%do_1/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=CONTRACT
// RUN: sed 's/%%k_bar = k3s.dot %%M_bar, %%q_1 <transpose_lhs = true> : !k3s.tile<C x K>/%%k_bar = k3s.dot %%M_bar, %%do_1 <transpose_lhs = true> : !k3s.tile<C x K>/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=RESULT
// RUN: sed 's/k3s.scale %%k_bar, %%Glast <along = columns>/k3s.scale %%k_bar, %%Glast <along = rows>/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=FACTOR
// RUN: sed 's/k3s.scale %%Y, %%scale <along = all>/k3s.scale %%Y, %%scale <along = columns>/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=SCALAR
// RUN: sed 's/k3s.store_cotangent %%k_bar_1, %%dk, %%k <of = k>/k3s.store_cotangent %%k_bar_1, %%dk, %%dq, %%k <of = k>/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=ODD
// RUN: sed 's/<of = k>/<of = o>/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=OF
// RUN: sed 's/k3s.store_cotangent %%q_bar_1, %%dq, %%q <of = q>/k3s.store_cotangent %%q_bar_1, %%dk, %%k <of = q>/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=PAIRS
// RUN: sed 's/k3s.unit_lower_inverse %%M_bar <block = 2>/k3s.unit_lower_inverse %%k_bar <block = 2>/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=INVERSE

builtin.module {
  k3.recurrence @r <gate = channel, delta_rule = true, num_heads = 2, num_v_heads = 2, head_k_dim = 8, head_v_dim = 4, scale = 0.25, state_layout = kv, dtype = float32>
  k3s.entry @chunk_backward <source = @r> {
    %q = k3s.tensor_arg @q <role = input> : !k3s.tensor<B x T x 2 x 8, float>
    %k = k3s.tensor_arg @k <role = input> : !k3s.tensor<B x T x 2 x 8, float>
    %g = k3s.tensor_arg @g <role = input> : !k3s.tensor<B x T x 2 x 8, float>
    %scale = k3s.scalar_arg @scale <default = 0.5> : f32
    %do = k3s.tensor_arg @do <role = input> : !k3s.tensor<B x T x 2 x 4, float>
    %dq = k3s.tensor_arg @dq <role = output> : !k3s.tensor<B x T x 2 x 8, float32>
    %dk = k3s.tensor_arg @dk <role = output> : !k3s.tensor<B x T x 2 x 8, float32>
    k3s.chunked_backward <chunk_size = 4> {
      %q_1 = k3s.load_chunk %q : !k3s.tile<C x K>
      %k_1 = k3s.load_chunk %k : !k3s.tile<C x K>
      %g_1 = k3s.load_gate %g <gate = channel, input = log, lower_bound = -5.0> : !k3s.tile<C x K>
      %G = k3s.gate_cumsum %g_1 <gate = channel> : !k3s.tile<C x K>
      %Glast = k3s.gate_total %G <gate = channel> : !k3s.tile<K>
      %do_1 = k3s.load_chunk %do : !k3s.tile<C x V>
      %P_bar = k3s.dot %do_1, %do_1 <transpose_rhs = true> : !k3s.tile<C x C>
      %M_bar = k3s.mask %P_bar <mask = inclusive> : !k3s.tile<C x C>
      %k_bar = k3s.dot %M_bar, %q_1 <transpose_lhs = true> : !k3s.tile<C x K>
      %q_bar = k3s.dot %M_bar, %k_1 : !k3s.tile<C x K>
      %M_inverse = k3s.unit_lower_inverse %M_bar <block = 2> : !k3s.tile<C x C>
      %Y = k3s.dot %M_inverse, %q_bar <transpose_lhs = true, accurate = true> : !k3s.tile<C x K>
      %q_bar_1 = k3s.scale %Y, %scale <along = all> : !k3s.tile<C x K>
      %k_bar_1 = k3s.scale %k_bar, %Glast <along = columns> : !k3s.tile<C x K>
      k3s.store_cotangent %q_bar_1, %dq, %q <of = q>
      k3s.store_cotangent %k_bar_1, %dk, %k <of = k>
    }
  }
}

// VALID:      %P_bar = k3s.dot %do_1, %do_1 <transpose_rhs = true> : !k3s.tile<C x C>
// VALID:      %k_bar = k3s.dot %M_bar, %q_1 <transpose_lhs = true> : !k3s.tile<C x K>
// VALID:      %M_inverse = k3s.unit_lower_inverse %M_bar <block = 2> : !k3s.tile<C x C>
// VALID-NEXT: %Y = k3s.dot %M_inverse, %q_bar <transpose_lhs = true, accurate = true> : !k3s.tile<C x K>
// VALID:      %k_bar_1 = k3s.scale %k_bar, %Glast <along = columns> : !k3s.tile<C x K>
// VALID-NEXT: k3s.store_cotangent %q_bar_1, %dq, %q <of = q>
// VALID-NEXT: k3s.store_cotangent %k_bar_1, %dk, %k <of = k>

// CONTRACT: {{^}}k3c opt: error: <stdin>: k3s.dot: contracts V with C (<C x V> by <C x V>){{$}}
// RESULT: {{^}}k3c opt: error: <stdin>: k3s.dot: the result must be <C x V>, got <C x K>{{$}}
// FACTOR: {{^}}k3c opt: error: <stdin>: k3s.scale: a factor along rows of <C x K> must be <C>, got <K>{{$}}
// SCALAR: {{^}}k3c opt: error: <stdin>: k3s.scale: a factor along columns of <C x K> must be <K>, got <>{{$}}
// ODD: {{^}}k3c opt: error: <stdin>: k3s.store_cotangent: takes gradient tensors and the inputs they are of, pair by pair; got 3 tensor(s){{$}}
// OF: {{^}}k3c opt: error: <stdin>:{{[0-9]+}}:{{[0-9]+}}: k3s.store_cotangent: property 'of' must be one of q, k, v, g, beta; got o{{$}}
// PAIRS: {{^}}k3c opt: error: <stdin>: k3s.store_cotangent: of = q stores d<input> for each input read, first q; got gradients dk of k{{$}}
// INVERSE: {{^}}k3c opt: error: <stdin>: k3s.unit_lower_inverse: A must be <C x C>, got <C x K>{{$}}
