// k3s.state_tile rejects block_v = 0: a zero-width tile (`block_v & (block_v - 1)` alone is 0
// for 0, so the power-of-two test needs the sign test too). The pass checks its block-v option,
// but hand-written or edited k3s IR is checked here.
// RUN: not k3c opt %s 2>&1 | filecheck %s --check-prefix=ERR

builtin.module {
  k3.recurrence @r <gate = channel, delta_rule = true, num_heads = 2, num_v_heads = 2, head_k_dim = 16, head_v_dim = 16, scale = 0.25, state_layout = kv, dtype = float32>
  k3s.entry @recurrent <source = @r> {
    k3s.kernel @r_recurrent <grid = [value_block, sequence_head], num_warps = 4> {
      %S = k3s.state_tile <head_k_dim = 16, head_v_dim = 16, block_v = 0, layout = kv, start = zero> : !k3s.tile<K x V>
    }
  }
}

// ERR-NOT: {{\n}}
// ERR: {{^}}k3c opt: error: {{.*}}: k3s.state_tile: block_v must be {{.*}}got 0{{$}}
// ERR-NOT: {{.}}
