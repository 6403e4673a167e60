// lower-backward{gradients-split=value-blocks}: the gradients kernel's value-block loop is a kernel
// of its own, a program per chunk, value head and value block (grid axis value_block). It
// recomputes what the loop reads of the stages before it (T, for dv), runs one block's stages
// (dv's columns stored there) and spills its parts of the loop's sums to fp32 workspaces
// [.., NVB, ..] (NVB = 2 at V = 128, block-v 64). The gradients kernel then adds the parts up
// right before their first reader and runs the chunk-local adjoints after the loop, without the
// states. Each kernel has its steep launch (flag STEEP on) where the member's gate is unbounded. The loop's widest
// product comes last (Triton lays out a chain of products as the last one). The printed Triton:
// the two kernels by name, the grid's third axis, the parts stored at the program's block and
// summed in block order. value-blocks-maxnreg caps the value-block kernels' registers alone.
// Anything but none / value-blocks is refused.
// RUN: k3c ir %examples/kda.toml -p 'derive-backward,lower-backward{gradients-split=value-blocks}' | filecheck %s
// RUN: k3c ir %examples/kda.toml -p 'derive-backward,lower-backward{gradients-split=value-blocks}' | k3c opt - | filecheck %s
// RUN: k3c compile %examples/kda.toml --stdout --no-autotune -p 'derive-backward,lower-backward{gradients-split=value-blocks},outline-kernels' | filecheck %s --check-prefix=TRITON
// RUN: k3c ir %examples/kda.toml -p 'derive-backward,lower-backward' | filecheck %s --check-prefix=NONE
// RUN: k3c ir %examples/kda.toml -p 'derive-backward,lower-backward{gradients-split=value-blocks value-blocks-maxnreg=128}' | filecheck %s --check-prefix=CAP
// RUN: not k3c ir %examples/kda.toml -p 'derive-backward,lower-backward{gradients-split=loop}' 2>&1 | filecheck %s --check-prefix=BAD
// RUN: not k3c ir %examples/kda.toml -p 'derive-backward,lower-backward{value-blocks-maxnreg=12}' 2>&1 | filecheck %s --check-prefix=BADCAP

// CHECK:       %KG_bar_parts = k3s.tensor_arg @KG_bar_parts <role = workspace> : !k3s.tensor<B x T x 32 x 2 x 128, float32>
// CHECK-NEXT:  %gamma_C_bar_parts = k3s.tensor_arg @gamma_C_bar_parts <role = workspace> : !k3s.tensor<NC x 32 x 2 x 128, float32>
// CHECK-NEXT:  %QG_bar_parts = k3s.tensor_arg @QG_bar_parts <role = workspace> : !k3s.tensor<B x T x 32 x 2 x 128, float32>
// CHECK-NEXT:  %P_bar_parts = k3s.tensor_arg @P_bar_parts <role = workspace> : !k3s.tensor<B x T x 32 x 2 x 16, float32>

// CHECK:       k3s.kernel @kda_backward_value_blocks <grid = [chunk, value_head, value_block], num_warps = 8, maxnreg = 255, flags = {STEEP = false}> {
// CHECK:         k3s.exit_unless %{{factorable_[0-9]+}} <holds = true>
// CHECK:         %T = k3s.scale %T_inverse, %beta_1 <along = columns>
// CHECK-NEXT:    %KG_bar, %gamma_C_bar, %QG_bar, %P_bar, %[[W:[A-Za-z_0-9]+]], %T_bar = k3s.value_block_loop <block_v = 64> {
// CHECK:           %S_1 = k3s.reload %S
// CHECK:           %v_bar = k3s.dot %T, %vr_bar_1 <transpose_lhs = true>
// CHECK:           k3s.store_cotangent %v_bar, %dv, %v <of = v>
// CHECK-NEXT:      %[[W]]_block = k3s.dot %vr_bar_1, %S_1 <transpose_rhs = true> : !k3s.tile<C x K>
// CHECK-NEXT:      k3s.sum_value_blocks
// CHECK:         k3s.spill_value_block_part %KG_bar_parts, %KG_bar
// CHECK-NEXT:    k3s.spill_value_block_part %gamma_C_bar_parts, %gamma_C_bar
// CHECK-NEXT:    k3s.spill_value_block_part %QG_bar_parts, %QG_bar
// CHECK-NEXT:    k3s.spill_value_block_part %P_bar_parts, %P_bar
// CHECK-NEXT:    k3s.spill_value_block_part %[[W]]_parts, %[[W]]
// CHECK-NEXT:    k3s.spill_value_block_part %T_bar_parts, %T_bar
// CHECK-NEXT:  }
// CHECK:       k3s.kernel @kda_backward_value_blocks_steep <grid = [chunk, value_head, value_block], num_warps = 8, maxnreg = 255, flags = {STEEP = true}> {
// CHECK:         %factorable = k3s.recorded_check %steep_chunks
// CHECK:         k3s.value_block_loop <block_v = 64>
// CHECK:         k3s.spill_value_block_part %T_bar_parts, %T_bar
// CHECK:       k3s.kernel @kda_backward_gradients <grid = [chunk, value_head], num_warps = 8, maxnreg = 255, flags = {STEEP = false}> {
// CHECK-NOT:     k3s.reload %S
// CHECK-NOT:     k3s.value_block_loop
// CHECK:         %[[W]] = k3s.sum_value_block_parts %[[W]]_parts : !k3s.tile<C x K>
// CHECK-NEXT:    %W_bar = k3s.neg %[[W]]
// CHECK:         %KG_bar = k3s.sum_value_block_parts %KG_bar_parts : !k3s.tile<C x K>
// CHECK-NEXT:    %k_bar = k3s.gate_apply %KG_bar
// CHECK:         k3s.store_cotangent %q_bar_1, %dq, %q <of = q>
// CHECK:       k3s.kernel @kda_backward_gradients_steep <grid = [chunk, value_head], num_warps = 8, maxnreg = 255, flags = {STEEP = true}> {
// CHECK:         k3s.sum_value_block_parts %KG_bar_parts

// TRITON-LABEL: def kda_backward_value_blocks_kernel(
// TRITON:         """k3s.kernel @kda_backward_value_blocks <grid = [chunk, value_head, value_block], {{.*}}block_v = 64, flags = {STEEP = false}, launch_params = [chunk_table, T], key_heads = 32>
// TRITON:         # grid axis 2: a block of BV value columns
// TRITON-NEXT:    i_v = tl.program_id(2)
// TRITON:         # k3s.chunk_tile %cu_seqlens <chunk_size = 16, head_k_dim = 128, head_v_dim = 128>: this program's token rows, all key columns
// TRITON:         = k3s.value_block_loop <block_v = 64>: one block of BV value columns, this program's (grid axis value_block)
// TRITON-NOT:     tl.static_range
// TRITON:         # k3s.sum_value_blocks
// TRITON-NEXT:    b_KG_bar = b_KG_bar_block
// TRITON:         # k3s.spill_value_block_part %KG_bar_parts, %KG_bar <layout = #k3s.layout<token[T], head[HV], part[2], column[K]>>: its block's slot
// TRITON-NEXT:    tl.store(KG_bar_parts + ((t_c[:, None] * HV + i_hv) * 2 + i_v) * K + o_k[None, :], b_KG_bar, mask=m_c[:, None] & m_k[None, :])
// TRITON-NEXT:    # k3s.spill_value_block_part %gamma_C_bar_parts, %gamma_C_bar
// TRITON-NEXT:    tl.store(gamma_C_bar_parts + (((start // BC + i_n) * HV + i_hv) * 2 + i_v) * K + o_k, b_gamma_C_bar, mask=m_k)
// TRITON-LABEL: def kda_backward_gradients_kernel(
// TRITON-NOT:     S_bar,
// TRITON:         KG_bar_parts,
// TRITON:         # %KG_bar = k3s.sum_value_block_parts %KG_bar_parts <unroll = true, layout = #k3s.layout<token[T], head[HV], part[2], column[K]>>: the value blocks' parts added in block order
// TRITON-NEXT:    b_KG_bar = tl.zeros([BC, BK], dtype=tl.float32)
// TRITON-NEXT:    for i_p in tl.static_range(0, 2):
// TRITON-NEXT:        b_KG_bar += tl.load(KG_bar_parts + ((t_c[:, None] * HV + i_hv) * 2 + i_p) * K + o_k[None, :], mask=m_c[:, None] & m_k[None, :], other=0.0)
// TRITON-NOT:     def kda_backward_gradients_steep_kernel(
// TRITON-LABEL: def chunk_backward(
// TRITON:         KG_bar_parts = _alloc((dims["B"], dims["T"], 32, 2, 128), torch.float32, q.device)
// TRITON:         # k3s.kernel @kda_backward_value_blocks <grid = [chunk, value_head, value_block]{{.*}}>: launch
// TRITON:         grid = (num_chunks, HV, triton.cdiv(V, BV))
// TRITON-NEXT:    if all(grid):
// TRITON-NEXT:        kda_backward_value_blocks_kernel[grid](
// TRITON:                 STEEP=False,
// TRITON:         # k3s.kernel @kda_backward_value_blocks_steep <{{.*}}shares_code_of = @kda_backward_value_blocks, launch_params = [chunk_table, T], key_heads = 32>: launch
// TRITON:                 STEEP=True,

// NONE-NOT:    k3s.kernel @kda_backward_value_blocks
// NONE-NOT:    _parts

// CAP:       k3s.kernel @kda_backward_value_blocks <grid = [chunk, value_head, value_block], num_warps = 8, maxnreg = 128, flags = {STEEP = false}>
// CAP:       k3s.kernel @kda_backward_value_blocks_steep <grid = [chunk, value_head, value_block], num_warps = 8, maxnreg = 128, flags = {STEEP = true}>
// CAP:       k3s.kernel @kda_backward_gradients <grid = [chunk, value_head], num_warps = 8, maxnreg = 255, flags = {STEEP = false}>

// BADCAP: k3c ir: error: pipeline {{.*}}: lower-backward: value-blocks-maxnreg must be 0 (no cap) or in 24..255, got 12

// BAD: k3c ir: error: pipeline {{.*}}: lower-backward: gradients-split must be one of none, value-blocks, got 'loop'
