// k3s.when: its flag is one its kernel declares (a misspelt one fails verify() in one line), the
// kernel's flags are exactly those its guards read, each an upper-case name set to true or
// false, and a guard's values are read only inside it (a launch that skips it would
// leave them unset: in text the parser already refuses it, for IR that passes build the
// verifier does, tests/test_ir.py). The file as written is valid; each sed variant breaks one rule.
// RUN: k3c opt %s | filecheck %s
// RUN: sed 's/k3s.spill %%W, %%A/k3s.spill %%W, %%P_1/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=ESCAPES
// RUN: sed 's/flag = SPILL_P>/flag = SPIL_P>/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=MISSPELT
// RUN: sed 's/flags = {SPILL_P = false}/flags = {SPILL_Q = false}/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=UNDECLARED
// RUN: sed 's/flags = {SPILL_P = false}/flags = {SPILL_P = false, SPILL_Q = true}/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=UNREAD
// RUN: sed 's/, flags = {SPILL_P = false}//' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=NONE
// RUN: sed 's/SPILL_P/spill_p/g' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=NAME
// RUN: sed 's/flags = {SPILL_P = false}/flags = {SPILL_P = 0}/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=NAME
// RUN: sed 's/flags = {SPILL_P = false}/flags = {SPILL_P = false, SPILL_P = true}/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=TWICE

builtin.module {
  k3.recurrence @layer <gate = channel, delta_rule = true, num_heads = 2, num_v_heads = 2, head_k_dim = 8, head_v_dim = 4, scale = 0.25, state_layout = kv, dtype = float32>
  k3s.entry @summary <source = @layer> {
    %k = k3s.tensor_arg @k <role = input> : !k3s.tensor<B x T x 2 x 8, float>
    %W = k3s.tensor_arg @W <role = workspace> : !k3s.tensor<B x T x 4 x 8, float>
    %P = k3s.tensor_arg @P <role = workspace> : !k3s.tensor<B x T x 4 x 16, float>
    %q = k3s.absent_tensor : !k3s.tensor<B x T x 2 x 8, float>
    k3s.kernel @prepare <grid = [chunk, value_head], num_warps = 4, flags = {SPILL_P = false}> {
      k3s.chunk_tile <chunk_size = 16, head_k_dim = 8, head_v_dim = 4>
      %k_1 = k3s.load_chunk %k : !k3s.tile<C x K>
      k3s.when <flag = SPILL_P> {
        %q_1 = k3s.load_chunk %q : !k3s.tile<C x K>
        %P_1 = k3s.gram %q_1, %k_1 <mask = inclusive, gate = none, beta = false> : !k3s.tile<C x C>
        k3s.spill %P, %P_1
      }
      %A = k3s.gram %k_1, %k_1 <mask = strict, gate = none, beta = false> : !k3s.tile<C x C>
      k3s.spill %W, %A
    }
  }
}

// CHECK:      %[[Q:[a-z_0-9]+]] = k3s.absent_tensor : !k3s.tensor<B x T x 2 x 8, float>
// CHECK:      k3s.kernel @prepare <grid = [chunk, value_head], num_warps = 4, flags = {SPILL_P = false}> {
// CHECK:        k3s.when <flag = SPILL_P> {
// CHECK-NEXT:     %{{.*}} = k3s.load_chunk %[[Q]] : !k3s.tile<C x K>

// ESCAPES: k3c opt: error: <stdin>:{{[0-9]+}}:{{[0-9]+}}: SSA value used before assignment
// MISSPELT: k3c opt: error: {{.*}}k3s.when <flag = SPIL_P>: its kernel @prepare declares no flag SPIL_P (its flags: SPILL_P){{$}}
// MISSPELT-NOT: {{.}}
// UNDECLARED: k3c opt: error: {{.*}}k3s.when <flag = SPILL_P>: its kernel @prepare declares no flag SPILL_P (its flags: SPILL_Q)
// NONE: k3c opt: error: {{.*}}k3s.when <flag = SPILL_P>: its kernel @prepare declares no flag SPILL_P (its flags: none)
// UNREAD: k3c opt: error: {{.*}}k3s.kernel @prepare: its flags ['SPILL_P', 'SPILL_Q'] must be those its k3s.when and k3s.flag stages read, ['SPILL_P']
// NAME: k3c opt: error: {{.*}}k3s.kernel @prepare: a flag is an upper-case name (a constexpr of the code) set to true or false
// TWICE: k3c opt: error: {{.*}}dictionary key 'SPILL_P' is given twice
