// num_warps must be a power of two in 1..32 (Triton's launch would fail otherwise): the passes
// reject a bad num-warps option as a one-line error, and k3s.kernel verifies it (and
// num_stages >= 1) in hand-written IR (verify/k3s_values.mlir).
// RUN: not k3c opt %s -p 'lower-recurrent{num-warps=0}' 2>&1 | filecheck %s --check-prefix=ERR
// RUN: not k3c opt %s -p 'lower-recurrent{num-warps=3}' 2>&1 | filecheck %s --check-prefix=ERR
// fuse-attnres's num-warps 0 (its default) takes the warps the row needs; any other must be valid.
// RUN: not k3c opt %s -p 'fuse-attnres{num-warps=3}' 2>&1 | filecheck %s --check-prefix=ERR
// RUN: not k3c opt %s -p 'fuse-attnres{num-warps=-4}' 2>&1 | filecheck %s --check-prefix=ERR

builtin.module {
  k3.recurrence @r <gate = channel, delta_rule = true, num_heads = 4, num_v_heads = 4, head_k_dim = 64, head_v_dim = 64, scale = 0.125, state_layout = kv, dtype = float32>
  k3.attnres @ar <hidden_size = 64, num_blocks = 2, block_size = 3, eps = 0.001, dtype = float32>
}

// ERR-NOT: {{\n}}
// ERR: {{^}}k3c opt: error: {{.*}}num{{[-_]}}warps{{.*}}{{$}}
// ERR-NOT: {{.}}
