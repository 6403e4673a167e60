// lower-backward's options. split-gradients: the gradients kernel cut after its value-block loop,
// the loop's sums spilled (fp32 workspaces) by the first half and reloaded by the second, which
// recomputes the chunk-local stages it reads; each half with its steep twin (an unbounded channel
// gate). gradients-maxnreg: every gradients kernel's register cap (255 by default), 0 none.
// RUN: k3c ir %examples/kda.toml -p 'derive-backward,lower-backward{split-gradients=true}' | filecheck %s
// RUN: k3c ir %examples/kda.toml -p 'derive-backward,lower-backward{split-gradients=true}' | k3c opt - | filecheck %s
// RUN: k3c ir %examples/kda.toml -p 'derive-backward,lower-backward{gradients-maxnreg=0}' | filecheck %s --check-prefix=NOCAP
// RUN: not k3c ir %examples/kda.toml -p 'derive-backward,lower-backward{gradients-maxnreg=300}' 2>&1 | filecheck %s --check-prefix=BADCAP

// CHECK:       %KG_bar = k3s.tensor_arg @KG_bar <role = workspace> : !k3s.tensor<B x T x 32 x 128, float32>
// CHECK:       %gamma_C_bar = k3s.tensor_arg @gamma_C_bar <role = workspace> : !k3s.tensor<NC x 32 x 128, float32>
// CHECK:       %P_bar = k3s.tensor_arg @P_bar <role = workspace> : !k3s.tensor<B x T x 32 x 16, float32>
// CHECK:       k3s.kernel @kda_backward_gradients_value_blocks <grid = "chunk,value_head", num_warps = 8, maxnreg = 255>
// CHECK:         k3s.record_check %steep_chunks, %factorable
// CHECK:         = k3s.value_block_loop <block_v = 64>
// CHECK:           k3s.reload %S_bar
// CHECK:         k3s.spill %KG_bar, %KG_bar_1
// CHECK-NEXT:    k3s.spill %gamma_C_bar, %gamma_C_bar_1
// CHECK:         k3s.spill %T_bar, %T_bar_1
// CHECK-NEXT:  }
// CHECK-NEXT:  k3s.kernel @kda_backward_gradients_value_blocks_steep
// CHECK-NEXT:    k3s.chunk_tile
// CHECK-NEXT:    %factorable = k3s.recorded_check %steep_chunks
// CHECK:       k3s.kernel @kda_backward_gradients <grid = "chunk,value_head", num_warps = 8, maxnreg = 255>
// CHECK-NOT:     k3s.value_block_loop
// CHECK:         k3s.gram
// CHECK:         %KG_bar_1 = k3s.reload %KG_bar : !k3s.tile<C x K>
// CHECK:         %T_bar_1 = k3s.reload %T_bar : !k3s.tile<C x C>
// CHECK:         k3s.store_cotangent
// CHECK:       k3s.kernel @kda_backward_gradients_steep

// NOCAP:       k3s.kernel @kda_backward_gradients <grid = "chunk,value_head", num_warps = 8> {
// NOCAP-NOT:   maxnreg

// BADCAP: k3c ir: error: pipeline {{.*}}: lower-backward: gradients-maxnreg must be 0 (no cap) or in 24..255, got 300
