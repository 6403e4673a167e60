// guard-spill-only-stages on hand-written kernels (each case its own chunk size, so that no
// kernel of one case is the other's minus anything). A kernel that is another of another entry
// minus stages that only feed spills it does not make (@narrow_prepare: no query Gram P) gets
// the other's body, those stages under k3s.when, with the flag off; the other and every kernel
// with its body (@peer_prepare) get it with the flag on. Not when the extra stages' values feed a
// stage the narrow kernel lacks (@reads_q: q feeds its W too), nor when they are not one run of
// ops (@split: its KG spill between them). Running the pass again changes nothing, and the IR
// it prints parses back.
// RUN: k3c opt %s -p guard-spill-only-stages | filecheck %s
// RUN: k3c opt %s -p guard-spill-only-stages,guard-spill-only-stages | k3c opt - | filecheck %s

builtin.module {
  k3s.entry @chunk <source = layer> {
    k3s.kernel @wide_prepare <grid = "chunk,value_head", num_warps = 4> {
      k3s.chunk_tile <chunk_size = 16, head_k_dim = 8, head_v_dim = 4>
      %k = k3s.load_chunk <tensor = k> : !k3s.tile<C x K>
      k3s.spill %k <value = KG>
      %q = k3s.load_chunk <tensor = q> : !k3s.tile<C x K>
      %P = k3s.gram %q, %k <mask = inclusive, gate = none, beta = false> : !k3s.tile<C x C>
      k3s.spill %P <value = P>
      %A = k3s.gram %k, %k <mask = strict, gate = none, beta = false> : !k3s.tile<C x C>
      k3s.spill %A <value = W>
    }
    k3s.kernel @reads_q_wide <grid = "chunk,value_head", num_warps = 4> {
      k3s.chunk_tile <chunk_size = 32, head_k_dim = 8, head_v_dim = 4>
      %k = k3s.load_chunk <tensor = k> : !k3s.tile<C x K>
      %q = k3s.load_chunk <tensor = q> : !k3s.tile<C x K>
      %P = k3s.gram %q, %k <mask = inclusive, gate = none, beta = false> : !k3s.tile<C x C>
      k3s.spill %P <value = P>
      %A = k3s.gram %q, %k <mask = strict, gate = none, beta = false> : !k3s.tile<C x C>
      k3s.spill %A <value = W>
    }
    k3s.kernel @split_wide <grid = "chunk,value_head", num_warps = 4> {
      k3s.chunk_tile <chunk_size = 64, head_k_dim = 8, head_v_dim = 4>
      %q = k3s.load_chunk <tensor = q> : !k3s.tile<C x K>
      %k = k3s.load_chunk <tensor = k> : !k3s.tile<C x K>
      k3s.spill %k <value = KG>
      k3s.spill %q <value = QG>
    }
  }
  k3s.entry @summary <source = layer> {
    k3s.kernel @narrow_prepare <grid = "chunk,value_head", num_warps = 8> {
      k3s.chunk_tile <chunk_size = 16, head_k_dim = 8, head_v_dim = 4>
      %k = k3s.load_chunk <tensor = k> : !k3s.tile<C x K>
      k3s.spill %k <value = KG>
      %A = k3s.gram %k, %k <mask = strict, gate = none, beta = false> : !k3s.tile<C x C>
      k3s.spill %A <value = W>
    }
    k3s.kernel @reads_q <grid = "chunk,value_head", num_warps = 4> {
      k3s.chunk_tile <chunk_size = 32, head_k_dim = 8, head_v_dim = 4>
      %k = k3s.load_chunk <tensor = k> : !k3s.tile<C x K>
      %A = k3s.gram %k, %k <mask = strict, gate = none, beta = false> : !k3s.tile<C x C>
      k3s.spill %A <value = W>
    }
    k3s.kernel @split <grid = "chunk,value_head", num_warps = 4> {
      k3s.chunk_tile <chunk_size = 64, head_k_dim = 8, head_v_dim = 4>
      %k = k3s.load_chunk <tensor = k> : !k3s.tile<C x K>
      k3s.spill %k <value = KG>
    }
  }
  k3s.entry @segments <source = layer> {
    k3s.kernel @peer_prepare <grid = "chunk,value_head", num_warps = 4> {
      k3s.chunk_tile <chunk_size = 16, head_k_dim = 8, head_v_dim = 4>
      %k = k3s.load_chunk <tensor = k> : !k3s.tile<C x K>
      k3s.spill %k <value = KG>
      %q = k3s.load_chunk <tensor = q> : !k3s.tile<C x K>
      %P = k3s.gram %q, %k <mask = inclusive, gate = none, beta = false> : !k3s.tile<C x C>
      k3s.spill %P <value = P>
      %A = k3s.gram %k, %k <mask = strict, gate = none, beta = false> : !k3s.tile<C x C>
      k3s.spill %A <value = W>
    }
  }
}

// CHECK:      k3s.kernel @wide_prepare <grid = "chunk,value_head", num_warps = 4, flags = {SPILL_P = true}> {
// CHECK-NEXT:   k3s.chunk_tile <chunk_size = 16, head_k_dim = 8, head_v_dim = 4>
// CHECK-NEXT:   %k = k3s.load_chunk <tensor = k> : !k3s.tile<C x K>
// CHECK-NEXT:   k3s.spill %k <value = KG>
// CHECK-NEXT:   k3s.when <flag = SPILL_P> {
// CHECK-NEXT:     %q = k3s.load_chunk <tensor = q> : !k3s.tile<C x K>
// CHECK-NEXT:     %P = k3s.gram %q, %k <mask = inclusive, gate = none, beta = false> : !k3s.tile<C x C>
// CHECK-NEXT:     k3s.spill %P <value = P>
// CHECK-NEXT:   }
// CHECK-NEXT:   %A = k3s.gram %k, %k <mask = strict, gate = none, beta = false> : !k3s.tile<C x C>
// CHECK-NEXT:   k3s.spill %A <value = W>
// CHECK-NEXT: }
// CHECK-NEXT: k3s.kernel @reads_q_wide <grid = "chunk,value_head", num_warps = 4> {
// CHECK-NOT:  k3s.when
// CHECK:      k3s.kernel @split_wide <grid = "chunk,value_head", num_warps = 4> {
// CHECK-NOT:  k3s.when
// CHECK:      k3s.entry @summary <source = layer> {
// the narrow kernel keeps its own launch settings (8 warps)
// CHECK-NEXT: k3s.kernel @narrow_prepare <grid = "chunk,value_head", num_warps = 8, flags = {SPILL_P = false}> {
// CHECK-NEXT:   k3s.chunk_tile <chunk_size = 16, head_k_dim = 8, head_v_dim = 4>
// CHECK-NEXT:   %k = k3s.load_chunk <tensor = k> : !k3s.tile<C x K>
// CHECK-NEXT:   k3s.spill %k <value = KG>
// CHECK-NEXT:   k3s.when <flag = SPILL_P> {
// CHECK-NEXT:     %q = k3s.load_chunk <tensor = q> : !k3s.tile<C x K>
// CHECK-NEXT:     %P = k3s.gram %q, %k <mask = inclusive, gate = none, beta = false> : !k3s.tile<C x C>
// CHECK-NEXT:     k3s.spill %P <value = P>
// CHECK-NEXT:   }
// CHECK-NEXT:   %A = k3s.gram %k, %k <mask = strict, gate = none, beta = false> : !k3s.tile<C x C>
// CHECK-NEXT:   k3s.spill %A <value = W>
// CHECK-NEXT: }
// CHECK-NEXT: k3s.kernel @reads_q <grid = "chunk,value_head", num_warps = 4> {
// CHECK-NOT:  k3s.when
// CHECK:      k3s.kernel @split <grid = "chunk,value_head", num_warps = 4> {
// CHECK-NOT:  k3s.when
// CHECK:      k3s.kernel @peer_prepare <grid = "chunk,value_head", num_warps = 4, flags = {SPILL_P = true}> {
// CHECK:        k3s.when <flag = SPILL_P> {
