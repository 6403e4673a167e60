// guard-spill-only-stages on hand-written kernels (each case its own chunk size, so that no
// kernel of one case is the other's minus anything). A kernel that is another of another entry
// minus stages that only feed spills it does not make (@narrow_prepare: no query Gram P) gets
// the other's body, those stages under k3s.when, with the flag off; the other and every kernel
// with its body (@peer_prepare) get it with the flag on. Not when the extra stages' values feed a
// stage the narrow kernel lacks (@reads_q: q feeds its W too), nor when they are not one run of
// ops (@split: its KG spill between them). Kernels of different entries compare reading their
// own entries' same-named tensors; a kernel given the other's body reads its own entry's, and a
// tensor its entry lacks (q of @summary, read only under the guard) becomes a k3s.absent_tensor
// of the entry. Running the pass again changes nothing, and the IR it prints parses back.
// RUN: k3c opt %s -p guard-spill-only-stages | filecheck %s
// RUN: k3c opt %s -p guard-spill-only-stages,guard-spill-only-stages | k3c opt - | filecheck %s

builtin.module {
  k3s.entry @chunk <source = layer> {
<<<<<<< HEAD
    %KG = k3s.tensor_arg @KG <role = workspace> : !k3s.tensor<B x T x 2 x 8, float>
    %P = k3s.tensor_arg @P <role = workspace> : !k3s.tensor<B x T x 2 x 16, float>
    %QG = k3s.tensor_arg @QG <role = workspace> : !k3s.tensor<B x T x 2 x 8, float>
    %W = k3s.tensor_arg @W <role = workspace> : !k3s.tensor<B x T x 2 x 8, float>
    k3s.kernel @wide_prepare <grid = "chunk,value_head", num_warps = 4> {
      k3s.chunk_tile <chunk_size = 16, head_k_dim = 8, head_v_dim = 4>
      %k = k3s.load_chunk <tensor = k> : !k3s.tile<C x K>
      k3s.spill %KG, %k
      %q = k3s.load_chunk <tensor = q> : !k3s.tile<C x K>
      %Pt = k3s.gram %q, %k <mask = inclusive, gate = none, beta = false> : !k3s.tile<C x C>
      k3s.spill %P, %Pt
      %A = k3s.gram %k, %k <mask = strict, gate = none, beta = false> : !k3s.tile<C x C>
      k3s.spill %W, %A
    }
    k3s.kernel @reads_q_wide <grid = "chunk,value_head", num_warps = 4> {
      k3s.chunk_tile <chunk_size = 32, head_k_dim = 8, head_v_dim = 4>
      %k = k3s.load_chunk <tensor = k> : !k3s.tile<C x K>
      %q = k3s.load_chunk <tensor = q> : !k3s.tile<C x K>
      %Pt = k3s.gram %q, %k <mask = inclusive, gate = none, beta = false> : !k3s.tile<C x C>
      k3s.spill %P, %Pt
      %A = k3s.gram %q, %k <mask = strict, gate = none, beta = false> : !k3s.tile<C x C>
      k3s.spill %W, %A
    }
    k3s.kernel @split_wide <grid = "chunk,value_head", num_warps = 4> {
      k3s.chunk_tile <chunk_size = 64, head_k_dim = 8, head_v_dim = 4>
      %q = k3s.load_chunk <tensor = q> : !k3s.tile<C x K>
      %k = k3s.load_chunk <tensor = k> : !k3s.tile<C x K>
      k3s.spill %KG, %k
      k3s.spill %QG, %q
    }
  }
  k3s.entry @summary <source = layer> {
    %KG_1 = k3s.tensor_arg @KG <role = workspace> : !k3s.tensor<B x T x 2 x 8, float>
    %W_1 = k3s.tensor_arg @W <role = workspace> : !k3s.tensor<B x T x 2 x 8, float>
    k3s.kernel @narrow_prepare <grid = "chunk,value_head", num_warps = 8> {
      k3s.chunk_tile <chunk_size = 16, head_k_dim = 8, head_v_dim = 4>
      %k = k3s.load_chunk <tensor = k> : !k3s.tile<C x K>
      k3s.spill %KG_1, %k
      %A = k3s.gram %k, %k <mask = strict, gate = none, beta = false> : !k3s.tile<C x C>
      k3s.spill %W_1, %A
    }
    k3s.kernel @reads_q <grid = "chunk,value_head", num_warps = 4> {
      k3s.chunk_tile <chunk_size = 32, head_k_dim = 8, head_v_dim = 4>
      %k = k3s.load_chunk <tensor = k> : !k3s.tile<C x K>
      %A = k3s.gram %k, %k <mask = strict, gate = none, beta = false> : !k3s.tile<C x C>
      k3s.spill %W_1, %A
    }
    k3s.kernel @split <grid = "chunk,value_head", num_warps = 4> {
      k3s.chunk_tile <chunk_size = 64, head_k_dim = 8, head_v_dim = 4>
      %k = k3s.load_chunk <tensor = k> : !k3s.tile<C x K>
      k3s.spill %KG_1, %k
    }
  }
  k3s.entry @segments <source = layer> {
    %KG_2 = k3s.tensor_arg @KG <role = workspace> : !k3s.tensor<B x T x 2 x 8, float>
    %P_2 = k3s.tensor_arg @P <role = workspace> : !k3s.tensor<B x T x 2 x 16, float>
    %W_2 = k3s.tensor_arg @W <role = workspace> : !k3s.tensor<B x T x 2 x 8, float>
    k3s.kernel @peer_prepare <grid = "chunk,value_head", num_warps = 4> {
      k3s.chunk_tile <chunk_size = 16, head_k_dim = 8, head_v_dim = 4>
      %k = k3s.load_chunk <tensor = k> : !k3s.tile<C x K>
      k3s.spill %KG_2, %k
      %q = k3s.load_chunk <tensor = q> : !k3s.tile<C x K>
      %Pt = k3s.gram %q, %k <mask = inclusive, gate = none, beta = false> : !k3s.tile<C x C>
      k3s.spill %P_2, %Pt
      %A = k3s.gram %k, %k <mask = strict, gate = none, beta = false> : !k3s.tile<C x C>
      k3s.spill %W_2, %A
=======
    %q = k3s.tensor_arg @q <role = input> : !k3s.tensor<B x T x 2 x 8, float>
    %k = k3s.tensor_arg @k <role = input> : !k3s.tensor<B x T x 2 x 8, float>
    k3s.kernel @wide_prepare <grid = "chunk,value_head", num_warps = 4> {
      k3s.chunk_tile <chunk_size = 16, head_k_dim = 8, head_v_dim = 4>
      %kc = k3s.load_chunk %k : !k3s.tile<C x K>
      k3s.spill %kc <value = KG>
      %qc = k3s.load_chunk %q : !k3s.tile<C x K>
      %P = k3s.gram %qc, %kc <mask = inclusive, gate = none, beta = false> : !k3s.tile<C x C>
      k3s.spill %P <value = P>
      %A = k3s.gram %kc, %kc <mask = strict, gate = none, beta = false> : !k3s.tile<C x C>
      k3s.spill %A <value = W>
    }
    k3s.kernel @reads_q_wide <grid = "chunk,value_head", num_warps = 4> {
      k3s.chunk_tile <chunk_size = 32, head_k_dim = 8, head_v_dim = 4>
      %kc = k3s.load_chunk %k : !k3s.tile<C x K>
      %qc = k3s.load_chunk %q : !k3s.tile<C x K>
      %P = k3s.gram %qc, %kc <mask = inclusive, gate = none, beta = false> : !k3s.tile<C x C>
      k3s.spill %P <value = P>
      %A = k3s.gram %qc, %kc <mask = strict, gate = none, beta = false> : !k3s.tile<C x C>
      k3s.spill %A <value = W>
    }
    k3s.kernel @split_wide <grid = "chunk,value_head", num_warps = 4> {
      k3s.chunk_tile <chunk_size = 64, head_k_dim = 8, head_v_dim = 4>
      %qc = k3s.load_chunk %q : !k3s.tile<C x K>
      %kc = k3s.load_chunk %k : !k3s.tile<C x K>
      k3s.spill %kc <value = KG>
      k3s.spill %qc <value = QG>
    }
  }
  k3s.entry @summary <source = layer> {
    %k_1 = k3s.tensor_arg @k <role = input> : !k3s.tensor<B x T x 2 x 8, float>
    k3s.kernel @narrow_prepare <grid = "chunk,value_head", num_warps = 8> {
      k3s.chunk_tile <chunk_size = 16, head_k_dim = 8, head_v_dim = 4>
      %kc = k3s.load_chunk %k_1 : !k3s.tile<C x K>
      k3s.spill %kc <value = KG>
      %A = k3s.gram %kc, %kc <mask = strict, gate = none, beta = false> : !k3s.tile<C x C>
      k3s.spill %A <value = W>
    }
    k3s.kernel @reads_q <grid = "chunk,value_head", num_warps = 4> {
      k3s.chunk_tile <chunk_size = 32, head_k_dim = 8, head_v_dim = 4>
      %kc = k3s.load_chunk %k_1 : !k3s.tile<C x K>
      %A = k3s.gram %kc, %kc <mask = strict, gate = none, beta = false> : !k3s.tile<C x C>
      k3s.spill %A <value = W>
    }
    k3s.kernel @split <grid = "chunk,value_head", num_warps = 4> {
      k3s.chunk_tile <chunk_size = 64, head_k_dim = 8, head_v_dim = 4>
      %kc = k3s.load_chunk %k_1 : !k3s.tile<C x K>
      k3s.spill %kc <value = KG>
    }
  }
  k3s.entry @segments <source = layer> {
    %q_1 = k3s.tensor_arg @q <role = input> : !k3s.tensor<B x T x 2 x 8, float>
    %k_2 = k3s.tensor_arg @k <role = input> : !k3s.tensor<B x T x 2 x 8, float>
    k3s.kernel @peer_prepare <grid = "chunk,value_head", num_warps = 4> {
      k3s.chunk_tile <chunk_size = 16, head_k_dim = 8, head_v_dim = 4>
      %kc = k3s.load_chunk %k_2 : !k3s.tile<C x K>
      k3s.spill %kc <value = KG>
      %qc = k3s.load_chunk %q_1 : !k3s.tile<C x K>
      %P = k3s.gram %qc, %kc <mask = inclusive, gate = none, beta = false> : !k3s.tile<C x C>
      k3s.spill %P <value = P>
      %A = k3s.gram %kc, %kc <mask = strict, gate = none, beta = false> : !k3s.tile<C x C>
      k3s.spill %A <value = W>
>>>>>>> values_loads
    }
  }
}

<<<<<<< HEAD
// CHECK:      k3s.kernel @wide_prepare <grid = "chunk,value_head", num_warps = 4, flags = {SPILL_P = true}> {
// CHECK-NEXT:   k3s.chunk_tile <chunk_size = 16, head_k_dim = 8, head_v_dim = 4>
// CHECK-NEXT:   %k = k3s.load_chunk <tensor = k> : !k3s.tile<C x K>
// CHECK-NEXT:   k3s.spill %KG, %k
// CHECK-NEXT:   k3s.when <flag = SPILL_P> {
// CHECK-NEXT:     %q = k3s.load_chunk <tensor = q> : !k3s.tile<C x K>
// CHECK-NEXT:     %Pt = k3s.gram %q, %k <mask = inclusive, gate = none, beta = false> : !k3s.tile<C x C>
// CHECK-NEXT:     k3s.spill %P, %Pt
// CHECK-NEXT:   }
// CHECK-NEXT:   %A = k3s.gram %k, %k <mask = strict, gate = none, beta = false> : !k3s.tile<C x C>
// CHECK-NEXT:   k3s.spill %W, %A
// CHECK-NEXT: }
// CHECK-NEXT: k3s.kernel @reads_q_wide <grid = "chunk,value_head", num_warps = 4> {
// CHECK-NOT:  k3s.when
// CHECK:      k3s.kernel @split_wide <grid = "chunk,value_head", num_warps = 4> {
// CHECK-NOT:  k3s.when
// CHECK:      k3s.entry @summary <source = layer> {
// CHECK-NEXT:   %KG_1 = k3s.tensor_arg @KG <role = workspace>
// CHECK-NEXT:   %W_1 = k3s.tensor_arg @W <role = workspace>
// the narrow kernel's entry declares the workspace only its guarded stages spill to, skipped: its
// launch skips them
// CHECK-NEXT:   %P_1 = k3s.tensor_arg @P <role = skipped> : !k3s.tensor<B x T x 2 x 16, float>
// the narrow kernel keeps its own launch settings (8 warps) and spills to its own entry's workspaces
// CHECK-NEXT: k3s.kernel @narrow_prepare <grid = "chunk,value_head", num_warps = 8, flags = {SPILL_P = false}> {
// CHECK-NEXT:   k3s.chunk_tile <chunk_size = 16, head_k_dim = 8, head_v_dim = 4>
// CHECK-NEXT:   %k_3 = k3s.load_chunk <tensor = k> : !k3s.tile<C x K>
// CHECK-NEXT:   k3s.spill %KG_1, %k_3
// CHECK-NEXT:   k3s.when <flag = SPILL_P> {
// CHECK-NEXT:     %q_3 = k3s.load_chunk <tensor = q> : !k3s.tile<C x K>
// CHECK-NEXT:     %Pt_2 = k3s.gram %q_3, %k_3 <mask = inclusive, gate = none, beta = false> : !k3s.tile<C x C>
// CHECK-NEXT:     k3s.spill %P_1, %Pt_2
// CHECK-NEXT:   }
// CHECK-NEXT:   %A_2 = k3s.gram %k_3, %k_3 <mask = strict, gate = none, beta = false> : !k3s.tile<C x C>
// CHECK-NEXT:   k3s.spill %W_1, %A_2
// CHECK-NEXT: }
// CHECK-NEXT: k3s.kernel @reads_q <grid = "chunk,value_head", num_warps = 4> {
// CHECK-NOT:  k3s.when
// CHECK:      k3s.kernel @split <grid = "chunk,value_head", num_warps = 4> {
// CHECK-NOT:  k3s.when
// CHECK:      k3s.entry @segments <source = layer> {
// CHECK-NOT:    @P <role = skipped>
// CHECK:      k3s.kernel @peer_prepare <grid = "chunk,value_head", num_warps = 4, flags = {SPILL_P = true}> {
// CHECK:        k3s.when <flag = SPILL_P> {
=======
// CHECK:      k3s.entry @chunk <source = layer> {
// CHECK-NEXT:   %[[Q:[A-Za-z_0-9]+]] = k3s.tensor_arg @q
// CHECK-NEXT:   %[[K:[A-Za-z_0-9]+]] = k3s.tensor_arg @k
// CHECK-NEXT:   k3s.kernel @wide_prepare <grid = "chunk,value_head", num_warps = 4, flags = {SPILL_P = true}> {
// CHECK-NEXT:     k3s.chunk_tile <chunk_size = 16, head_k_dim = 8, head_v_dim = 4>
// CHECK-NEXT:     %[[k:[a-z_0-9]+]] = k3s.load_chunk %[[K]] : !k3s.tile<C x K>
// CHECK-NEXT:     k3s.spill %[[k]] <value = KG>
// CHECK-NEXT:     k3s.when <flag = SPILL_P> {
// CHECK-NEXT:       %[[q:[a-z_0-9]+]] = k3s.load_chunk %[[Q]] : !k3s.tile<C x K>
// CHECK-NEXT:       %[[P:[A-Za-z_0-9]+]] = k3s.gram %[[q]], %[[k]] <mask = inclusive, gate = none, beta = false> : !k3s.tile<C x C>
// CHECK-NEXT:       k3s.spill %[[P]] <value = P>
// CHECK-NEXT:     }
// CHECK-NEXT:     %[[A:[A-Za-z_0-9]+]] = k3s.gram %[[k]], %[[k]] <mask = strict, gate = none, beta = false> : !k3s.tile<C x C>
// CHECK-NEXT:     k3s.spill %[[A]] <value = W>
// CHECK-NEXT:   }
// CHECK-NEXT:   k3s.kernel @reads_q_wide <grid = "chunk,value_head", num_warps = 4> {
// CHECK-NOT:    k3s.when
// CHECK:        k3s.kernel @split_wide <grid = "chunk,value_head", num_warps = 4> {
// CHECK-NOT:    k3s.when
// the narrow kernel runs the wide one's code on its own entry's k; the q only the guarded stages
// read, which its entry lacks, is an absent tensor (its launch passes None)
// CHECK:      k3s.entry @summary <source = layer> {
// CHECK-NEXT:   %[[K2:[A-Za-z_0-9]+]] = k3s.tensor_arg @k
// CHECK-NEXT:   %[[Q2:[A-Za-z_0-9]+]] = k3s.absent_tensor : !k3s.tensor<B x T x 2 x 8, float>
// the narrow kernel keeps its own launch settings (8 warps)
// CHECK-NEXT:   k3s.kernel @narrow_prepare <grid = "chunk,value_head", num_warps = 8, flags = {SPILL_P = false}> {
// CHECK-NEXT:     k3s.chunk_tile <chunk_size = 16, head_k_dim = 8, head_v_dim = 4>
// CHECK-NEXT:     %[[k2:[a-z_0-9]+]] = k3s.load_chunk %[[K2]] : !k3s.tile<C x K>
// CHECK-NEXT:     k3s.spill %[[k2]] <value = KG>
// CHECK-NEXT:     k3s.when <flag = SPILL_P> {
// CHECK-NEXT:       %[[q2:[a-z_0-9]+]] = k3s.load_chunk %[[Q2]] : !k3s.tile<C x K>
// CHECK-NEXT:       %[[P2:[A-Za-z_0-9]+]] = k3s.gram %[[q2]], %[[k2]] <mask = inclusive, gate = none, beta = false> : !k3s.tile<C x C>
// CHECK-NEXT:       k3s.spill %[[P2]] <value = P>
// CHECK-NEXT:     }
// CHECK-NEXT:     %[[A2:[A-Za-z_0-9]+]] = k3s.gram %[[k2]], %[[k2]] <mask = strict, gate = none, beta = false> : !k3s.tile<C x C>
// CHECK-NEXT:     k3s.spill %[[A2]] <value = W>
// CHECK-NEXT:   }
// CHECK-NEXT:   k3s.kernel @reads_q <grid = "chunk,value_head", num_warps = 4> {
// CHECK-NOT:    k3s.when
// CHECK:        k3s.kernel @split <grid = "chunk,value_head", num_warps = 4> {
// CHECK-NOT:    k3s.when
// CHECK:      k3s.entry @segments <source = layer> {
// CHECK-NEXT:   %[[Q3:[A-Za-z_0-9]+]] = k3s.tensor_arg @q
// CHECK-NEXT:   %[[K3:[A-Za-z_0-9]+]] = k3s.tensor_arg @k
// CHECK-NEXT:   k3s.kernel @peer_prepare <grid = "chunk,value_head", num_warps = 4, flags = {SPILL_P = true}> {
// CHECK-NEXT:     k3s.chunk_tile
// CHECK-NEXT:     %{{[a-z_0-9]+}} = k3s.load_chunk %[[K3]] : !k3s.tile<C x K>
// CHECK:          k3s.when <flag = SPILL_P> {
// CHECK-NEXT:       %{{[a-z_0-9]+}} = k3s.load_chunk %[[Q3]] : !k3s.tile<C x K>
>>>>>>> values_loads
