// guard-spill-only-stages on hand-written kernels (each case its own chunk size, so that no
// kernel of one case is the other's minus anything). A kernel that is another of another entry
// minus stages that only feed spills it does not make (@narrow_prepare: no query Gram P) gets
// the other's body, those stages under k3s.when, with the flag off; the other and every kernel
// with its body (@peer_prepare) get it with the flag on. Not when the extra stages' values feed a
// stage the narrow kernel lacks (@reads_q: q feeds its W too), nor when a run of them feeds
// another (@split: its KG spill between the q load and the QG spill, which two guards would hold).
// The extra stages may be in a loop (@wide_scan's spill in its chunk loop), and each kernel may
// write a tensor the other does not (@wide_scan's final, @narrow_scan's N): each one's such
// stores are guarded, the narrow one's copied into the shared body under the flag off. Kernels of
// different entries compare reading their own entries' same-named tensors; a kernel given the
// shared body reads its own entry's, and a tensor its entry lacks (q of @summary, N of @chunk,
// read only under the guard its launch skips) becomes a k3s.absent_tensor of the entry. Running
// the pass again changes nothing, and the IR it prints parses back.
// RUN: k3c opt %s -p outline-kernels,guard-spill-only-stages | filecheck %s
// RUN: k3c opt %s -p outline-kernels,guard-spill-only-stages,guard-spill-only-stages | k3c opt - | filecheck %s

builtin.module {
  k3.recurrence @layer <gate = channel, delta_rule = true, num_heads = 2, num_v_heads = 2, head_k_dim = 8, head_v_dim = 4, scale = 0.25, state_layout = kv, dtype = float32>
  k3s.entry @chunk <source = @layer> {
    %q = k3s.tensor_arg @q <role = input> : !k3s.tensor<B x T x 2 x 8, float>
    %k = k3s.tensor_arg @k <role = input> : !k3s.tensor<B x T x 2 x 8, float>
    %KG = k3s.tensor_arg @KG <role = workspace> : !k3s.tensor<B x T x 2 x 8, float>
    %P = k3s.tensor_arg @P <role = workspace> : !k3s.tensor<B x T x 2 x 16, float>
    %QG = k3s.tensor_arg @QG <role = workspace> : !k3s.tensor<B x T x 2 x 8, float>
    %W = k3s.tensor_arg @W <role = workspace> : !k3s.tensor<B x T x 2 x 8, float>
    %v = k3s.tensor_arg @v <role = input> : !k3s.tensor<B x T x 2 x 4, float>
    %states = k3s.tensor_arg @states <role = workspace> : !k3s.tensor<NC x 2 x 8 x 4, float>
    %final = k3s.tensor_arg @final <role = optional_output> : !k3s.tensor<N x 2 x 8 x 4, float32>
    k3s.kernel @wide_scan <grid = [value_block, sequence_head], num_warps = 4, num_stages = 2> {
      %S = k3s.state_tile <head_k_dim = 8, head_v_dim = 4, block_v = 4, layout = kv, start = zero> : !k3s.tile<K x V>
      %S_final = k3s.chunk_loop %S <chunk_size = 8> {
      ^bb0(%S_1: !k3s.tile<K x V>):
        k3s.spill %states, %S_1
        %kc = k3s.load_chunk %k : !k3s.tile<C x K>
        %vc = k3s.load_chunk %v : !k3s.tile<C x V>
        %S_2 = k3s.state_advance %S_1, %kc, %vc <gate = none> : !k3s.tile<K x V>
        k3s.next_chunk %S_2
      } : !k3s.tile<K x V>
      k3s.store_state %S_final, %final <layout = kv>
    }
    k3s.kernel @wide_prepare <grid = [chunk, value_head], num_warps = 4> {
      k3s.chunk_tile <chunk_size = 16, head_k_dim = 8, head_v_dim = 4>
      %kc = k3s.load_chunk %k : !k3s.tile<C x K>
      k3s.spill %KG, %kc
      %qc = k3s.load_chunk %q : !k3s.tile<C x K>
      %Pt = k3s.gram %qc, %kc <mask = inclusive, gate = none, beta = false> : !k3s.tile<C x C>
      k3s.spill %P, %Pt
      %A = k3s.gram %kc, %kc <mask = strict, gate = none, beta = false> : !k3s.tile<C x C>
      k3s.spill %W, %A
    }
    k3s.kernel @reads_q_wide <grid = [chunk, value_head], num_warps = 4> {
      k3s.chunk_tile <chunk_size = 32, head_k_dim = 8, head_v_dim = 4>
      %kc = k3s.load_chunk %k : !k3s.tile<C x K>
      %qc = k3s.load_chunk %q : !k3s.tile<C x K>
      %Pt = k3s.gram %qc, %kc <mask = inclusive, gate = none, beta = false> : !k3s.tile<C x C>
      k3s.spill %P, %Pt
      %A = k3s.gram %qc, %kc <mask = strict, gate = none, beta = false> : !k3s.tile<C x C>
      k3s.spill %W, %A
    }
    k3s.kernel @split_wide <grid = [chunk, value_head], num_warps = 4> {
      k3s.chunk_tile <chunk_size = 64, head_k_dim = 8, head_v_dim = 4>
      %qc = k3s.load_chunk %q : !k3s.tile<C x K>
      %kc = k3s.load_chunk %k : !k3s.tile<C x K>
      k3s.spill %KG, %kc
      k3s.spill %QG, %qc
    }
  }
  k3s.entry @summary <source = @layer> {
    %k_1 = k3s.tensor_arg @k <role = input> : !k3s.tensor<B x T x 2 x 8, float>
    %KG_1 = k3s.tensor_arg @KG <role = workspace> : !k3s.tensor<B x T x 2 x 8, float>
    %W_1 = k3s.tensor_arg @W <role = workspace> : !k3s.tensor<B x T x 2 x 8, float>
    %v_1 = k3s.tensor_arg @v <role = input> : !k3s.tensor<B x T x 2 x 4, float>
    %N = k3s.tensor_arg @N <role = output> : !k3s.tensor<N x 2 x 8 x 4, float32>
    k3s.kernel @narrow_scan <grid = [value_block, sequence_head], num_warps = 4, num_stages = 2> {
      %S = k3s.state_tile <head_k_dim = 8, head_v_dim = 4, block_v = 4, layout = kv, start = zero> : !k3s.tile<K x V>
      %S_final = k3s.chunk_loop %S <chunk_size = 8> {
      ^bb0(%S_1: !k3s.tile<K x V>):
        %kc = k3s.load_chunk %k_1 : !k3s.tile<C x K>
        %vc = k3s.load_chunk %v_1 : !k3s.tile<C x V>
        %S_2 = k3s.state_advance %S_1, %kc, %vc <gate = none> : !k3s.tile<K x V>
        k3s.next_chunk %S_2
      } : !k3s.tile<K x V>
      k3s.store_state %S_final, %N <layout = kv>
    }
    k3s.kernel @narrow_prepare <grid = [chunk, value_head], num_warps = 8> {
      k3s.chunk_tile <chunk_size = 16, head_k_dim = 8, head_v_dim = 4>
      %kc = k3s.load_chunk %k_1 : !k3s.tile<C x K>
      k3s.spill %KG_1, %kc
      %A = k3s.gram %kc, %kc <mask = strict, gate = none, beta = false> : !k3s.tile<C x C>
      k3s.spill %W_1, %A
    }
    k3s.kernel @reads_q <grid = [chunk, value_head], num_warps = 4> {
      k3s.chunk_tile <chunk_size = 32, head_k_dim = 8, head_v_dim = 4>
      %kc = k3s.load_chunk %k_1 : !k3s.tile<C x K>
      %A = k3s.gram %kc, %kc <mask = strict, gate = none, beta = false> : !k3s.tile<C x C>
      k3s.spill %W_1, %A
    }
    k3s.kernel @split <grid = [chunk, value_head], num_warps = 4> {
      k3s.chunk_tile <chunk_size = 64, head_k_dim = 8, head_v_dim = 4>
      %kc = k3s.load_chunk %k_1 : !k3s.tile<C x K>
      k3s.spill %KG_1, %kc
    }
  }
  k3s.entry @segments <source = @layer> {
    %q_1 = k3s.tensor_arg @q <role = input> : !k3s.tensor<B x T x 2 x 8, float>
    %k_2 = k3s.tensor_arg @k <role = input> : !k3s.tensor<B x T x 2 x 8, float>
    %KG_2 = k3s.tensor_arg @KG <role = workspace> : !k3s.tensor<B x T x 2 x 8, float>
    %P_2 = k3s.tensor_arg @P <role = workspace> : !k3s.tensor<B x T x 2 x 16, float>
    %W_2 = k3s.tensor_arg @W <role = workspace> : !k3s.tensor<B x T x 2 x 8, float>
    k3s.kernel @peer_prepare <grid = [chunk, value_head], num_warps = 4> {
      k3s.chunk_tile <chunk_size = 16, head_k_dim = 8, head_v_dim = 4>
      %kc = k3s.load_chunk %k_2 : !k3s.tile<C x K>
      k3s.spill %KG_2, %kc
      %qc = k3s.load_chunk %q_1 : !k3s.tile<C x K>
      %Pt = k3s.gram %qc, %kc <mask = inclusive, gate = none, beta = false> : !k3s.tile<C x C>
      k3s.spill %P_2, %Pt
      %A = k3s.gram %kc, %kc <mask = strict, gate = none, beta = false> : !k3s.tile<C x C>
      k3s.spill %W_2, %A
    }
  }
}

// a spill inside the chunk loop is guarded where it stands; each kernel's state store (of a tensor
// the other does not write) under the flag as its launch sets it, the narrow kernel's N an argument
// CHECK:      k3s.kernel @wide_scan <grid = [value_block, sequence_head], num_warps = 4, num_stages = 2, flags = {SPILL_STATES = true}> {
// CHECK-NEXT: ^bb0(%k: !k3s.tensor<B x T x 2 x 8, float>, %v: !k3s.tensor<B x T x 2 x 4, float>, %states: !k3s.tensor<NC x 2 x 8 x 4, float>, %final: !k3s.tensor<N x 2 x 8 x 4, float32>, %N: !k3s.tensor<N x 2 x 8 x 4, float32>):
// CHECK-NEXT:   %S = k3s.state_tile <head_k_dim = 8, head_v_dim = 4, block_v = 4, layout = kv, start = zero> : !k3s.tile<K x V>
// CHECK-NEXT:   %S_final = k3s.chunk_loop %S <chunk_size = 8> {
// CHECK-NEXT:   ^bb0(%S_1: !k3s.tile<K x V>):
// CHECK-NEXT:     k3s.when <flag = SPILL_STATES> {
// CHECK-NEXT:       k3s.spill %states, %S_1
// CHECK-NEXT:     }
// CHECK-NEXT:     %kc = k3s.load_chunk %k : !k3s.tile<C x K>
// CHECK:          k3s.next_chunk %S_2
// CHECK-NEXT:   } : !k3s.tile<K x V>
// CHECK-NEXT:   k3s.when <flag = SPILL_STATES> {
// CHECK-NEXT:     k3s.store_state %S_final, %final <layout = kv>
// CHECK-NEXT:   }
// CHECK-NEXT:   k3s.when <flag = SPILL_STATES, on = false> {
// CHECK-NEXT:     k3s.store_state %S_final, %N <layout = kv>
// CHECK-NEXT:   }
// CHECK-NEXT: }
// CHECK:      k3s.kernel @wide_prepare <grid = [chunk, value_head], num_warps = 4, flags = {SPILL_P = true}> {
// CHECK-NEXT: ^bb0(%q: !k3s.tensor<B x T x 2 x 8, float>, %k: !k3s.tensor<B x T x 2 x 8, float>, %KG: !k3s.tensor<B x T x 2 x 8, float>, %P: !k3s.tensor<B x T x 2 x 16, float>, %W: !k3s.tensor<B x T x 2 x 8, float>):
// CHECK-NEXT:   k3s.chunk_tile <chunk_size = 16, head_k_dim = 8, head_v_dim = 4>
// CHECK-NEXT:   %kc = k3s.load_chunk %k : !k3s.tile<C x K>
// CHECK-NEXT:   k3s.spill %KG, %kc
// CHECK-NEXT:   k3s.when <flag = SPILL_P> {
// CHECK-NEXT:     %qc = k3s.load_chunk %q : !k3s.tile<C x K>
// CHECK-NEXT:     %Pt = k3s.gram %qc, %kc <mask = inclusive, gate = none, beta = false> : !k3s.tile<C x C>
// CHECK-NEXT:     k3s.spill %P, %Pt
// CHECK-NEXT:   }
// CHECK-NEXT:   %A = k3s.gram %kc, %kc <mask = strict, gate = none, beta = false> : !k3s.tile<C x C>
// CHECK-NEXT:   k3s.spill %W, %A
// CHECK-NEXT: }
// CHECK-NEXT: k3s.kernel @reads_q_wide <grid = [chunk, value_head], num_warps = 4> {
// CHECK-NOT:  k3s.when
// CHECK:      k3s.kernel @split_wide <grid = [chunk, value_head], num_warps = 4> {
// CHECK-NOT:  k3s.when
// CHECK:      %N = k3s.absent_tensor : !k3s.tensor<N x 2 x 8 x 4, float32>
// CHECK-NEXT: k3s.launch @wide_scan %k, %v, %states, %final, %N
// CHECK-NEXT: k3s.launch @wide_prepare %q, %k, %KG, %P, %W
// CHECK:      k3s.kernel @narrow_scan <grid = [value_block, sequence_head], num_warps = 4, num_stages = 2, flags = {SPILL_STATES = false}> {
// CHECK-NEXT: ^bb0(%k: !k3s.tensor<B x T x 2 x 8, float>, %v: !k3s.tensor<B x T x 2 x 4, float>, %states: !k3s.tensor<NC x 2 x 8 x 4, float>, %final: !k3s.tensor<N x 2 x 8 x 4, float32>, %N: !k3s.tensor<N x 2 x 8 x 4, float32>):
// the narrow kernel gets the wide body (keeping its own 8 warps), the guard off
// CHECK:      k3s.kernel @narrow_prepare <grid = [chunk, value_head], num_warps = 8, flags = {SPILL_P = false}> {
// CHECK-NEXT: ^bb0(%q: !k3s.tensor<B x T x 2 x 8, float>, %k: !k3s.tensor<B x T x 2 x 8, float>, %KG: !k3s.tensor<B x T x 2 x 8, float>, %P: !k3s.tensor<B x T x 2 x 16, float>, %W: !k3s.tensor<B x T x 2 x 8, float>):
// CHECK:        k3s.when <flag = SPILL_P> {
// CHECK-NEXT:     %qc = k3s.load_chunk %q : !k3s.tile<C x K>
// CHECK:      k3s.kernel @reads_q <grid = [chunk, value_head], num_warps = 4> {
// CHECK-NOT:  k3s.when
// CHECK:      k3s.kernel @split <grid = [chunk, value_head], num_warps = 4> {
// CHECK-NOT:  k3s.when
// its entry lacks q and P, which only the guarded stages read and write: its launch passes them absent
// CHECK:      k3s.entry @summary <source = @layer> {
// CHECK-NEXT:   %k = k3s.tensor_arg @k
// CHECK-NEXT:   %KG = k3s.tensor_arg @KG
// CHECK-NEXT:   %W = k3s.tensor_arg @W
// CHECK-NEXT:   %v = k3s.tensor_arg @v
// CHECK-NEXT:   %N = k3s.tensor_arg @N
// CHECK-NEXT:   %states = k3s.absent_tensor : !k3s.tensor<NC x 2 x 8 x 4, float>
// CHECK-NEXT:   %final = k3s.absent_tensor : !k3s.tensor<N x 2 x 8 x 4, float32>
// CHECK-NEXT:   k3s.launch @narrow_scan %k, %v, %states, %final, %N
// CHECK-NEXT:   %q = k3s.absent_tensor : !k3s.tensor<B x T x 2 x 8, float>
// CHECK-NEXT:   %P = k3s.absent_tensor : !k3s.tensor<B x T x 2 x 16, float>
// CHECK-NEXT:   k3s.launch @narrow_prepare %q, %k, %KG, %P, %W
// CHECK-NEXT:   k3s.launch @reads_q %k, %W
// CHECK-NEXT:   k3s.launch @split %k, %KG
// CHECK:      k3s.kernel @peer_prepare <grid = [chunk, value_head], num_warps = 4, flags = {SPILL_P = true}> {
// CHECK:        k3s.when <flag = SPILL_P> {
// CHECK:      k3s.launch @peer_prepare %q, %k, %KG, %P, %W
