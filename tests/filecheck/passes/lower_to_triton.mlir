// lower-to-triton: how the Triton backend runs each stage, written on the IR before printing
// (the printer reads it): the kernels with products take the input dtype's precision
// (dots = input); the triangular inverse's products are at least tf32 and it takes
// log2(C / block) - 1 squarings (C = 16, block = 1: 3); a token's row is converted to fp32 as
// loaded, a chunk's rows stay in the input dtype; the loop over value blocks is unrolled; where
// a stage's rows are in an entry's tensor of token rows (a token's row, its head: q and k's query
// and key head, then the tile's columns). The properties print and parse back (k3c opt), a second
// run changes nothing, and a layout that does not fit its tensor is refused in one line.
// RUN: k3c ir %examples/kda.toml -p 'lower-recurrent,derive-chunkwise,fuse-chunkwise,derive-backward,lower-backward,outline-kernels,legalize-triton,lower-to-triton' | filecheck %s
// RUN: k3c ir %examples/kda.toml -p 'lower-recurrent,derive-chunkwise,fuse-chunkwise,derive-backward,lower-backward,outline-kernels,legalize-triton,lower-to-triton' | k3c opt - -p lower-to-triton | filecheck %s
// RUN: k3c ir %examples/kda.toml -p 'lower-recurrent,derive-chunkwise,fuse-chunkwise,derive-backward,lower-backward,outline-kernels,legalize-triton,lower-to-triton' | sed 's/load_token %q <dtype = fp32, layout = #k3s.layout<token\[T\], key_head\[H\], column\[K\]>>/load_token %q <dtype = fp32, layout = #k3s.layout<token[T], key_head[H]>>/' | not k3c opt - 2>&1 | filecheck %s --check-prefix=UNFIT

// CHECK:      k3s.kernel @kda_recurrent <grid = [value_block, sequence_head], num_warps = 4, block_k = 128, block_v = 32, launch_params = [T], key_heads = 32> {
// CHECK:        %q_1 = k3s.load_token %q <dtype = fp32, layout = #k3s.layout<token[T], key_head[H], column[K]>> : !k3s.tile<K>
// CHECK:      k3s.kernel @kda_chunk_prepare <grid = [chunk, value_head], num_warps = 4, dots = input, block_k = 128, block_v = 128, launch_params = [chunk_table, T], key_heads = 32> {
// CHECK:        %k_1 = k3s.load_chunk %k <dtype = input, layout = #k3s.layout<token[T], key_head[H], column[K]>> : !k3s.tile<C x K>
// CHECK:        %T = k3s.forward_substitution %A, %beta_1 <block = 1, accurate = true, squarings = 3> : !k3s.tile<C x C>
// CHECK:      k3s.kernel @kda_chunk_scan <grid = [value_block, sequence_head], {{.*}}dots = input,
// CHECK:      k3s.kernel @kda_backward_prepare <grid = [chunk, value_head], num_warps = 4, dots = input,
// CHECK:        %T_inverse = k3s.unit_lower_inverse %A <block = 1, accurate = true, squarings = 3>
// CHECK:      k3s.kernel @kda_backward_gradients <grid = [chunk, value_head], num_warps = 8, dots = input,
// CHECK:        k3s.value_block_loop <block_v = 64, unroll = true>

// UNFIT: k3c opt: error: {{.*}}k3s.load_token: layout #k3s.layout<token[T], key_head[H]> does not fit its tensor <B x T x 32 x 128>{{$}}
// UNFIT-NOT: {{.}}
