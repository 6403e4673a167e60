// lower-to-triton writes where each stage's rows are in its workspace (#k3s.layout: the axes
// outermost first, each with its extent, row-major), and the printer prints the address from it
// (common.tensor_address): a row per token ([B, T, HV, ...]: token, head, then the tile's
// columns) or per chunk ([NC, HV, ...]); value blocks' parts between the head and the columns.
// The layouts print and parse back, a second run changes nothing, and one that does not fit its
// workspace fails verify.
// RUN: k3c ir %examples/kda.toml -p 'lower-recurrent,derive-chunkwise,fuse-chunkwise,derive-backward,lower-backward{block-v=16 gradients-split=value-blocks},outline-kernels,legalize-triton,lower-to-triton' | filecheck %s
// RUN: k3c ir %examples/kda.toml -p 'lower-recurrent,derive-chunkwise,fuse-chunkwise,derive-backward,lower-backward{block-v=16 gradients-split=value-blocks},outline-kernels,legalize-triton,lower-to-triton' | k3c opt - -p lower-to-triton | filecheck %s
// RUN: k3c ir %examples/kda.toml -p 'lower-recurrent,derive-chunkwise,fuse-chunkwise,derive-backward,lower-backward{block-v=16 gradients-split=value-blocks},outline-kernels,legalize-triton,lower-to-triton' | sed 's/part\[8\], column\[K\]>> *$/part[4], column[K]>>/' | not k3c opt - 2>&1 | filecheck %s --check-prefix=PARTS

// CHECK:      k3s.kernel @kda_chunk_prepare
// CHECK:        k3s.spill %gamma_C, %gamma_C_1 <layout = #k3s.layout<chunk[NC], head[HV], column[K]>>
// CHECK:        k3s.spill %KG, %KG_1 <layout = #k3s.layout<token[T], head[HV], column[K]>>
// CHECK:        k3s.spill %P, %P_1 <layout = #k3s.layout<token[T], head[HV], column[C]>>
// CHECK:      k3s.kernel @kda_chunk_scan
// CHECK:        %U_1 = k3s.reload %U <layout = #k3s.layout<token[T], head[HV], column[V]>> : !k3s.tile<C x V>
// CHECK:      k3s.kernel @kda_backward_state_scan
// CHECK:        k3s.spill %S, %S_2 <layout = #k3s.layout<chunk[NC], head[HV], column[K], column[V]>>
// CHECK:      k3s.kernel @kda_backward_value_blocks
// CHECK:        k3s.record_check %steep_chunks, %factorable{{(_1)?}} <layout = #k3s.layout<chunk[NC], head[HV]>>
// CHECK:        k3s.spill_value_block_part %KG_bar_parts, %KG_bar <layout = #k3s.layout<token[T], head[HV], part[8], column[K]>>
// CHECK:        k3s.spill_value_block_part %gamma_C_bar_parts, %gamma_C_bar <layout = #k3s.layout<chunk[NC], head[HV], part[8], column[K]>>
// CHECK:      k3s.kernel @kda_backward_gradients
// CHECK:        k3s.sum_value_block_parts %KG_bar_parts <unroll = true, layout = #k3s.layout<token[T], head[HV], part[8], column[K]>>

// PARTS: k3c opt: error: <stdin>: k3s.spill_value_block_part: layout #k3s.layout<token[T], head[HV], part[4], column[K]> does not fit its tensor <B x T x 32 x 8 x 128>
