// derive-chunkwise{solve-block=N}: the rows of the triangular solve's diagonal blocks solved row
// by row (the rest by products of nilpotent factors); at most the chunk.
// RUN: k3c opt %s -p 'derive-chunkwise' | filecheck %s --check-prefix=DEFAULT
// RUN: k3c opt %s -p 'derive-chunkwise{solve-block=16}' | filecheck %s --check-prefix=ROWS
// RUN: k3c opt %s -p 'derive-chunkwise{chunk-size=4 solve-block=16}' | filecheck %s --check-prefix=CHUNK
// RUN: not k3c opt %s -p 'derive-chunkwise{solve-block=0}' 2>&1 | filecheck %s --check-prefix=BAD

builtin.module {
  k3.recurrence @gdn <gate = scalar, delta_rule = true, num_heads = 2, num_v_heads = 2, head_k_dim = 8, head_v_dim = 4, scale = 0.5, state_layout = kv, dtype = float32>
}

// DEFAULT: k3s.chunked <chunk_size = 16>
// DEFAULT: %T = k3s.forward_substitution %A, %{{beta(_[0-9]+)?}} <block = 1> : !k3s.tile<C x C>
// ROWS: %T = k3s.forward_substitution %A, %{{beta(_[0-9]+)?}} <block = 16> : !k3s.tile<C x C>
// CHUNK: %T = k3s.forward_substitution %A, %{{beta(_[0-9]+)?}} <block = 4> : !k3s.tile<C x C>
// BAD: k3c opt: error: pipeline {{.*}}: derive-chunkwise: chunk-size, sub-chunk and solve-block must be positive, got 16, 16, 0
