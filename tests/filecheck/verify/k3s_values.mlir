// k3s verifiers: enum-like properties and shapes of the schedule dialect are checked.
// RUN: not k3c opt %s 2>&1 | filecheck %s --check-prefix=ROLE
// RUN: sed 's/role = maybe/role = input/; s/B x T x 4 x 16/B x T x H x 16/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=SHAPE
// RUN: sed 's/role = maybe/role = input/; s/16, float>/16, double>/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=DTYPE
// RUN: sed 's/role = maybe/role = input/; s/block_v = 16/block_v = 24/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=BLOCKV
// RUN: sed 's/role = maybe/role = input/; s/%%g_1 <gate = scalar>/%%g_1 <gate = none>/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=GATE
// RUN: sed 's/role = maybe/role = input/; s/load_token %%q /load_token %%S /' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=TENSOR
// RUN: sed 's/role = maybe/role = input/; s/k3s.state_tile %%initial_state /k3s.state_tile /' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=TILEREADS
// RUN: sed 's/role = maybe/role = input/; s/layout = vk>/layout = vk, start = zero>/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=STARTREADS
// RUN: sed 's/role = maybe/role = input/; s/layout = vk>/layout = vk, home = pool>/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=POOLREADS
// RUN: sed 's/role = maybe/role = input/; s/, layout = vk/, layout = kk/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=LAYOUT
// RUN: sed 's/role = maybe/role = input/; s/num_warps = 4/num_warps = 3/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=WARPS
// RUN: sed 's/role = maybe/role = input/; s/grid = \[value_block,/grid = [value_blok,/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=GRID
// RUN: sed 's/role = maybe/role = input/; s/grid = \[value_block, sequence_head\]/grid = [value_block, value_block]/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=GRIDTWICE
// RUN: sed 's/role = maybe/role = input/; s/grid = \[value_block, sequence_head\]/grid = []/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=GRIDEMPTY
// RUN: sed 's/role = maybe/role = input/; s/grid = \[value_block, sequence_head\]/grid = value_block/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=GRIDWORD
// RUN: sed 's/role = maybe/role = input/; s/num_warps = 4/num_warps = 4, num_stages = 0/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=STAGES
// RUN: sed 's/role = maybe/role = input/; s/num_warps = 4/num_warps = 4, maxnreg = 300/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=MAXNREG
// RUN: sed 's/role = maybe/role = input/; s/num_warps = 4/num_warps = 4, min_rows = 8, max_rows = 7/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=ROWS
// RUN: sed 's/role = maybe/role = input/; s/num_warps = 4/num_warps = 4, max_rows = 0/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=ROWS0
// RUN: sed 's/role = maybe/role = input/; s/} : !k3s.tile<K x V>/} : !k3s.tile<K>/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=CARRIED
// RUN: sed 's/role = maybe/role = input/; s/state_shape = \[4, 16, 16\]/state_shape = "4,16,16"/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=CKPTWORDS
// RUN: sed 's/role = maybe/role = input/; s/state_shape = \[4, 16, 16\]/state_shape = [4, 0, 16]/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=CKPTZERO
// RUN: sed 's/role = maybe/role = input/' %s | k3c opt - | filecheck %s --check-prefix=VALID

builtin.module {
  k3.recurrence @r <gate = scalar, delta_rule = true, num_heads = 4, num_v_heads = 4, head_k_dim = 16, head_v_dim = 16, scale = 0.25, state_layout = vk, dtype = float32>
  k3s.entry @recurrent <source = @r> {
    %q = k3s.tensor_arg @q <role = maybe> : !k3s.tensor<B x T x 4 x 16, float>
    %g = k3s.tensor_arg @g <role = input> : !k3s.tensor<B x T x 4, float>
    %initial_state = k3s.tensor_arg @initial_state <role = optional_input> : !k3s.tensor<N x 4 x 16 x 16, float32>
    k3s.checkpoint_arg @checkpoint_every <chunk_size = 16, state_shape = [4, 16, 16]>
    k3s.kernel @r_recurrent <grid = [value_block, sequence_head], num_warps = 4> {
      %S0 = k3s.state_tile %initial_state <head_k_dim = 16, head_v_dim = 16, block_v = 16, layout = vk> : !k3s.tile<K x V>
      %S_final = k3s.token_loop %S0 {
      ^bb0(%S: !k3s.tile<K x V>):
        %q_1 = k3s.load_token %q : !k3s.tile<K>
        %g_1 = k3s.load_gate %g <gate = scalar, input = log, lower_bound = -5.0> : !k3s.tile<>
        %S_1 = k3s.decay %S, %g_1 <gate = scalar> : !k3s.tile<K x V>
        k3s.next_token %S_1
      } : !k3s.tile<K x V>
    }
  }
}

// ROLE-NOT: {{\n}}
// ROLE: {{^}}k3c opt: error: {{.*}}k3s_values.mlir:{{[0-9]+}}:{{[0-9]+}}: k3s.tensor_arg: property 'role' must be one of input, optional_input, forbidden, output, optional_output{{(, [a-z_]+)*}}; got maybe{{$}}
// ROLE-NOT: {{.}}

// SHAPE-NOT: {{\n}}
// SHAPE: {{^}}k3c opt: error: <stdin>:{{[0-9]+}}:{{[0-9]+}}: k3s.tensor: bad dimension 'H'; a positive integer or one of B, T, N, N+1, S, P, NC, R, PP, PB, HS, Q{{$}}
// SHAPE-NOT: {{.}}

// DTYPE-NOT: {{\n}}
// DTYPE: {{^}}k3c opt: error: <stdin>:{{[0-9]+}}:{{[0-9]+}}: k3s.tensor: the dtype class must be one of float, float32, offsets, state, index, fp4x2, fp4x8, e8m0; got double{{$}}
// DTYPE-NOT: {{.}}

// BLOCKV-NOT: {{\n}}
// BLOCKV: {{^}}k3c opt: error: <stdin>: k3s.state_tile: block_v must be a power of two, got 24{{$}}
// BLOCKV-NOT: {{.}}

// GATE-NOT: {{\n}}
// GATE: {{^}}k3c opt: error: <stdin>:{{[0-9]+}}:{{[0-9]+}}: k3s.decay: property 'gate' must be one of channel, scalar; got none{{$}}
// GATE-NOT: {{.}}

// TENSOR: {{^}}k3c opt: error: <stdin>: operand 'tensor' at position 0 does not verify:

// TILEREADS-NOT: {{\n}}
// TILEREADS: {{^}}k3c opt: error: <stdin>: k3s.state_tile: without a start or home it reads the initial state; got 0 tensor operands{{$}}
// TILEREADS-NOT: {{.}}

// STARTREADS-NOT: {{\n}}
// STARTREADS: {{^}}k3c opt: error: <stdin>: k3s.state_tile: a start reads no tensor; got 1 tensor operands{{$}}
// STARTREADS-NOT: {{.}}

// POOLREADS-NOT: {{\n}}
// POOLREADS: {{^}}k3c opt: error: <stdin>: k3s.state_tile: home = pool reads the pool and its slot table; got 1 tensor operands{{$}}
// POOLREADS-NOT: {{.}}

// LAYOUT-NOT: {{\n}}
// LAYOUT: {{^}}k3c opt: error: <stdin>:{{[0-9]+}}:{{[0-9]+}}: k3s.state_tile: property 'layout' must be one of kv, vk; got kk{{$}}
// LAYOUT-NOT: {{.}}

// WARPS-NOT: {{\n}}
// WARPS: {{^}}k3c opt: error: <stdin>: k3s.kernel @r_recurrent: num_warps must be a power of two in 1..32, got 3{{$}}
// WARPS-NOT: {{.}}

// GRID-NOT: {{\n}}
// GRID: {{^}}k3c opt: error: <stdin>:{{[0-9]+}}:{{[0-9]+}}: k3s.kernel: property 'grid' takes a list [...] of value_block, sequence_head, chunk, {{.*}}, one; got value_blok{{$}}
// GRID-NOT: {{.}}

// GRIDTWICE-NOT: {{\n}}
// GRIDTWICE: {{^}}k3c opt: error: <stdin>: k3s.kernel @r_recurrent: its grid must list 1 to 3 distinct axes, got [value_block, value_block]{{$}}
// GRIDTWICE-NOT: {{.}}

// GRIDEMPTY-NOT: {{\n}}
// GRIDEMPTY: {{^}}k3c opt: error: <stdin>: k3s.kernel @r_recurrent: its grid must list 1 to 3 distinct axes, got []{{$}}
// GRIDEMPTY-NOT: {{.}}

// GRIDWORD-NOT: {{\n}}
// GRIDWORD: {{^}}k3c opt: error: <stdin>:{{[0-9]+}}:{{[0-9]+}}: k3s.kernel: property 'grid' takes a list [...] of value_block, {{.*}}, one; got value_block, not a list{{$}}
// GRIDWORD-NOT: {{.}}

// STAGES-NOT: {{\n}}
// STAGES: {{^}}k3c opt: error: <stdin>: k3s.kernel @r_recurrent: num_stages must be >= 1, got 0{{$}}
// MAXNREG: {{^}}k3c opt: error: <stdin>: k3s.kernel @r_recurrent: maxnreg must be in 24..255, got 300{{$}}
// ROWS: {{^}}k3c opt: error: <stdin>: k3s.kernel @r_recurrent: rows bounds must be positive with min_rows <= max_rows, got min_rows 8, max_rows 7{{$}}
// ROWS0: {{^}}k3c opt: error: <stdin>: k3s.kernel @r_recurrent: rows bounds must be positive with min_rows <= max_rows, got min_rows None, max_rows 0{{$}}
// STAGES-NOT: {{.}}

// CARRIED-NOT: {{\n}}
// CARRIED: {{^}}k3c opt: error: <stdin>: k3s.token_loop: it carries one or more values (its state first), each an initial value, a block argument, a value passed on and a result of one type (scf.for's iter_args); got initial values (!k3s.tile<K x V>); block arguments (!k3s.tile<K x V>); values passed on (!k3s.tile<K x V>); results (!k3s.tile<K>){{$}}
// CARRIED-NOT: {{.}}

// VALID: %q = k3s.tensor_arg @q <role = input> : !k3s.tensor<B x T x 4 x 16, float>
// VALID: k3s.checkpoint_arg @checkpoint_every <chunk_size = 16, state_shape = [4, 16, 16]>

// CKPTWORDS-NOT: {{\n}}
// CKPTWORDS: {{^}}k3c opt: error: <stdin>:{{[0-9]+}}:{{[0-9]+}}: k3s.checkpoint_arg: property 'state_shape' expects a list [...] of sizes, got "4,16,16"{{$}}
// CKPTWORDS-NOT: {{.}}

// CKPTZERO-NOT: {{\n}}
// CKPTZERO: {{^}}k3c opt: error: <stdin>: k3s.checkpoint_arg: state_shape must be positive sizes, got [4, 0, 16]{{$}}
// CKPTZERO-NOT: {{.}}
