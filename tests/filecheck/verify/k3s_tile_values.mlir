// Chunk stages as ops on values: a tile's dimensions are C, K and V; an op's operands must match
// what its properties say it reads (the tensors a Gram reads only with an elementwise diagonal);
// a value is defined before its use; a loop's body ends in the op that passes its state on. The
// valid schedule prints back unchanged.
// RUN: k3c opt %s | filecheck %s --check-prefix=VALID
// RUN: sed 's/tile<C x C>/tile<C x Z>/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=DIM
// RUN: sed 's/%%P = k3s.gram %%q_1, %%k_1 </%%P = k3s.gram %%q_1, %%k_1, %%v_1 </' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=COUNT
// RUN: sed 's/%%P = k3s.gram %%q_1, %%k_1 </%%P = k3s.gram %%q_1, %%k_1, %%k </' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=TENSOR
// RUN: sed 's/<gate = none> : !k3s.tile<K x V>/<gate = scalar> : !k3s.tile<K x V>/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=DECAY
// RUN: sed 's/chunk_output %%q_1, %%S,/chunk_output %%q_1, %%S_9,/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=UNDEFINED
// RUN: sed '/k3s.next_chunk/d' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=TERMINATOR

builtin.module {
  k3.recurrence @r <gate = channel, delta_rule = true, num_heads = 2, num_v_heads = 2, head_k_dim = 8, head_v_dim = 4, scale = 0.25, state_layout = kv, dtype = float32>
  k3s.entry @chunk <source = @r> {
    %q = k3s.tensor_arg @q <role = input> : !k3s.tensor<B x T x 2 x 8, float>
    %k = k3s.tensor_arg @k <role = input> : !k3s.tensor<B x T x 2 x 8, float>
    %v = k3s.tensor_arg @v <role = input> : !k3s.tensor<B x T x 2 x 4, float>
    %scale = k3s.scalar_arg @scale <default = 0.25> : f32
    %o = k3s.tensor_arg @o <role = output> : !k3s.tensor<B x T x 2 x 4, float>
    k3s.chunked <chunk_size = 4> {
      %q_1 = k3s.load_chunk %q : !k3s.tile<C x K>
      %k_1 = k3s.load_chunk %k : !k3s.tile<C x K>
      %v_1 = k3s.load_chunk %v : !k3s.tile<C x V>
      %P = k3s.gram %q_1, %k_1 <mask = inclusive, gate = none, beta = false> : !k3s.tile<C x C>
      k3s.chunk_scan {
      ^bb0(%S: !k3s.tile<K x V>):
        %o_1 = k3s.chunk_output %q_1, %S, %P, %v_1, %o, %scale : !k3s.tile<C x V>
        %S_1 = k3s.state_advance %S, %k_1, %v_1 <gate = none> : !k3s.tile<K x V>
        k3s.next_chunk %S_1
      }
    }
  }
}

// VALID:      %P = k3s.gram %q_1, %k_1 <mask = inclusive, gate = none, beta = false> : !k3s.tile<C x C>
// VALID:      ^bb0(%S: !k3s.tile<K x V>):
// VALID-NEXT:   %o_1 = k3s.chunk_output %q_1, %S, %P, %v_1, %o, %scale : !k3s.tile<C x V>
// VALID-NEXT:   %S_1 = k3s.state_advance %S, %k_1, %v_1 <gate = none> : !k3s.tile<K x V>
// VALID-NEXT:   k3s.next_chunk %S_1

// DIM: {{^}}k3c opt: error: <stdin>:{{[0-9]+}}:{{[0-9]+}}: k3s.tile: unknown dimension 'Z'; allowed: C, NB, K, V, D, R, E, KS, M, N, Q, S{{$}}
// COUNT: {{^}}k3c opt: error: <stdin>:{{[0-9]+}}:{{[0-9]+}}: k3s.gram: its properties take 2 tile operands (lhs, keys), got 3{{$}}
// TENSOR: {{^}}k3c opt: error: <stdin>: k3s.gram: only an elementwise or guarded diagonal reads tensors; got 1 with mask = inclusive, gate = none, beta = false{{$}}
// DECAY: {{^}}k3c opt: error: <stdin>: k3s.state_advance: gamma_C is an operand exactly when gate is not none{{$}}
// UNDEFINED: {{^}}k3c opt: error: <stdin>:{{[0-9]+}}:{{[0-9]+}}: SSA value used before assignment{{$}}
// TERMINATOR: {{^}}k3c opt: error: <stdin>: Operation k3s.state_advance terminates block in single-block region but is not a terminator{{$}}
