// A chunk loop carries several values as scf.for carries its iter_args: a segment summary's N
// scan carries the state and the decay product M (from k3s.decay_product_start), each with an
// initial value, a block argument, a value next_chunk passes on and a result, of one type; the
// loop's operands are the carried values, then the sequence offsets. The valid kernel prints
// back unchanged; a value not passed on, a carried value of another type, a decay product not
// in its transition's form and offsets before the carried values are errors.
// RUN: k3c opt %s | filecheck %s --check-prefix=VALID
// RUN: k3c opt %s | k3c opt - | filecheck %s --check-prefix=VALID
// RUN: sed 's/k3s.next_chunk %%S_2, %%M_3/k3s.next_chunk %%S_2/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=PASSED
// RUN: sed 's/^      } : !k3s.tile<K x V>, !k3s.tile<K>/      } : !k3s.tile<K x V>, !k3s.tile<K x V>/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=RESULT
// RUN: sed 's/transition = diagonal> : !k3s.tile<K>$/transition = scalar> : !k3s.tile<K>/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=FORM
// RUN: sed 's/chunk_loop %%S, %%M_1, %%cu_seqlens/chunk_loop %%S, %%cu_seqlens, %%M_1/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=ORDER

builtin.module {
  k3.recurrence @gla <gate = channel, delta_rule = false, num_heads = 2, num_v_heads = 2, head_k_dim = 8, head_v_dim = 8, scale = 0.5, state_layout = vk, dtype = float32>
  k3s.entry @gla_segment_summary <source = @gla> {
    %v = k3s.tensor_arg @v <role = input> : !k3s.tensor<B x T x 2 x 8, float>
    %cu_seqlens = k3s.tensor_arg @cu_seqlens <role = optional_input, purpose = sequence_offsets> : !k3s.tensor<N+1, offsets>
    %M = k3s.tensor_arg @M <role = output> : !k3s.tensor<N x 2 x 8, float32>
    %N = k3s.tensor_arg @N <role = output> : !k3s.tensor<N x 2 x 8 x 8, float32>
    %KG = k3s.tensor_arg @KG <role = workspace> : !k3s.tensor<B x T x 2 x 8, float>
    %gamma_C = k3s.tensor_arg @gamma_C <role = workspace> : !k3s.tensor<NC x 2 x 8, float32>
    k3s.kernel @gla_summary_scan_N <grid = [value_block, sequence_head], num_warps = 4, num_stages = 2> {
      %S = k3s.state_tile <head_k_dim = 8, head_v_dim = 8, block_v = 8, layout = vk, start = zero> : !k3s.tile<K x V>
      %M_1 = k3s.decay_product_start <transition = diagonal> : !k3s.tile<K>
      %S_final, %M_final = k3s.chunk_loop %S, %M_1, %cu_seqlens <chunk_size = 16> {
      ^bb0(%S_1: !k3s.tile<K x V>, %M_2: !k3s.tile<K>):
        %KG_1 = k3s.reload %KG : !k3s.tile<C x K>
        %gamma_C_1 = k3s.reload %gamma_C : !k3s.tile<K>
        %v_1 = k3s.load_chunk %v : !k3s.tile<C x V>
        %S_2 = k3s.state_advance %S_1, %KG_1, %v_1, %gamma_C_1 <gate = channel> : !k3s.tile<K x V>
        %M_3 = k3s.decay_product %M_2, %gamma_C_1 <transition = diagonal> : !k3s.tile<K>
        k3s.next_chunk %S_2, %M_3
      } : !k3s.tile<K x V>, !k3s.tile<K>
      k3s.store_state %S_final, %N <layout = vk>
      k3s.store_transition %M_final, %M <transition = diagonal>
    }
  }
}

// VALID:      %M_1 = k3s.decay_product_start <transition = diagonal> : !k3s.tile<K>
// VALID-NEXT: %S_final, %M_final = k3s.chunk_loop %S, %M_1, %cu_seqlens <chunk_size = 16> {
// VALID-NEXT: ^bb0(%S_1: !k3s.tile<K x V>, %M_2: !k3s.tile<K>):
// VALID:        %M_3 = k3s.decay_product %M_2, %gamma_C_1 <transition = diagonal> : !k3s.tile<K>
// VALID-NEXT:   k3s.next_chunk %S_2, %M_3
// VALID-NEXT: } : !k3s.tile<K x V>, !k3s.tile<K>
// VALID-NEXT: k3s.store_state %S_final, %N <layout = vk>
// VALID-NEXT: k3s.store_transition %M_final, %M <transition = diagonal>

// PASSED: {{^}}k3c opt: error: <stdin>: k3s.chunk_loop: it carries one or more values (its state first), each an initial value, a block argument, a value passed on and a result of one type (scf.for's iter_args); got initial values (!k3s.tile<K x V>, !k3s.tile<K>); block arguments (!k3s.tile<K x V>, !k3s.tile<K>); values passed on (!k3s.tile<K x V>); results (!k3s.tile<K x V>, !k3s.tile<K>){{$}}
// RESULT: {{^}}k3c opt: error: <stdin>: k3s.chunk_loop: it carries {{.*}}; results (!k3s.tile<K x V>, !k3s.tile<K x V>){{$}}
// FORM: {{^}}k3c opt: error: <stdin>: k3s.decay_product_start: a scalar transition's M is a <> tile, got !k3s.tile<K>{{$}}
// ORDER: {{^}}k3c opt: error: <stdin>:{{[0-9]+}}:{{[0-9]+}}: k3s.chunk_loop: its operands are the values it carries (tiles), then the sequence offsets, if it reads them{{$}}
