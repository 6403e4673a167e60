// lower-backward's gradients-maxnreg: every gradients kernel's register cap (255 by default, the
// steep launch of an unbounded channel gate included), 0 none, anything else outside ptxas' range
// refused. Where the gate is unbounded, the gradients kernel holds its guarded forms with the
// constexpr flag STEEP as their guard, and its second launch (@kda_backward_gradients_steep, the
// steep chunks') is the same kernel with STEEP on. gradients-warps: the gradients kernels' warps
// (twice num-warps by default), a power of two; at 16 warps the register cap is lowered to the
// 128 a program of 512 threads can have (65536 an SM: at 255 it could not launch), and a kernel
// whose cap and warps exceed the register file does not verify.
// RUN: k3c ir %examples/kda.toml -p 'derive-backward,lower-backward' | filecheck %s
// RUN: k3c ir %examples/kda.toml -p 'derive-backward,lower-backward' | k3c opt - | filecheck %s
// RUN: k3c compile %examples/kda.toml --stdout --no-autotune -p 'derive-backward,lower-backward,outline-kernels' | filecheck %s --check-prefix=TRITON
// RUN: k3c ir %examples/kda.toml -p 'derive-backward,lower-backward{gradients-maxnreg=0}' | filecheck %s --check-prefix=NOCAP
// RUN: not k3c ir %examples/kda.toml -p 'derive-backward,lower-backward{gradients-maxnreg=300}' 2>&1 | filecheck %s --check-prefix=BADCAP
// RUN: k3c ir %examples/kda.toml -p 'derive-backward,lower-backward{gradients-warps=16}' | filecheck %s --check-prefix=WARPS
// RUN: not k3c ir %examples/kda.toml -p 'derive-backward,lower-backward{gradients-warps=12}' 2>&1 | filecheck %s --check-prefix=BADWARPS
// RUN: k3c ir %examples/kda.toml -p 'derive-backward,lower-backward' | sed 's/num_warps = 8, maxnreg = 255/num_warps = 16, maxnreg = 255/' | not k3c opt - 2>&1 | filecheck %s --check-prefix=REGFILE

// CHECK:       k3s.kernel @kda_backward_gradients <grid = [chunk, value_head], num_warps = 8, maxnreg = 255, flags = {STEEP = false}>
// CHECK-NEXT:    k3s.chunk_tile
// CHECK-NEXT:    k3s.when <flag = STEEP> {
// CHECK-NEXT:      %factorable = k3s.recorded_check %steep_chunks
// CHECK-NEXT:      k3s.exit_unless %factorable <holds = false>
// CHECK-NEXT:    }
// CHECK-NEXT:    %factored = k3s.flag <flag = STEEP, on = false> : i1
// CHECK:         k3s.when <flag = STEEP, on = false> {
// CHECK-NEXT:      %[[CHECK:[a-z_0-9]+]] = k3s.block_span_check %Gstart, %Gend
// CHECK-NEXT:      k3s.record_check %steep_chunks, %[[CHECK]]
// CHECK-NEXT:      k3s.exit_unless %[[CHECK]] <holds = true>
// CHECK-NEXT:    }
// CHECK:         k3s.gram {{.*}}, %factored, {{.*}}diagonal = guarded>
// CHECK:         = k3s.value_block_loop <block_v = 64>
// CHECK:         k3s.gated_contraction {{.*}}, %factored <side = rows, form = guarded>
// CHECK:       k3s.kernel @kda_backward_gradients_steep <grid = [chunk, value_head], num_warps = 8, maxnreg = 255, flags = {STEEP = true}>
// CHECK-NEXT:    k3s.chunk_tile
// CHECK-NEXT:    k3s.when <flag = STEEP> {

// The printed module: the gradients kernel once, launched twice (STEEP off, then on) from each
// entry that runs it; each launch's code is one form, Triton compiling it with the other gone.
// TRITON-COUNT-1: def kda_backward_gradients_kernel(
// TRITON-NOT:     def kda_backward_gradients_steep_kernel(
// TRITON:         if STEEP:
// TRITON-NEXT:        # %factorable = k3s.recorded_check %steep_chunks
// TRITON:         b_factored: tl.constexpr = not STEEP
// TRITON:         if not STEEP:
// TRITON-NEXT:        # %factorable = k3s.block_span_check %Gstart, %Gend <limit = 80.0>
// TRITON:         if b_factored:
// TRITON-NEXT:        # diagonal blocks: the left factor against the diagonal factor
// TRITON:         else:
// TRITON-NEXT:        # diagonal blocks elementwise
// TRITON-LABEL:   def chunk_backward(
// TRITON:             kda_backward_gradients_kernel[grid](
// TRITON:                 STEEP=False,
// TRITON:             kda_backward_gradients_kernel[grid](
// TRITON:                 STEEP=True,

// NOCAP:       k3s.kernel @kda_backward_gradients <grid = [chunk, value_head], num_warps = 8, flags = {STEEP = false}> {
// NOCAP-NOT:   maxnreg

// BADCAP: k3c ir: error: pipeline {{.*}}: lower-backward: gradients-maxnreg must be 0 (no cap) or in 24..255, got 300

// WARPS:       k3s.kernel @kda_backward_prepare <grid = [chunk, value_head], num_warps = 4
// WARPS:       k3s.kernel @kda_backward_gradients <grid = [chunk, value_head], num_warps = 16, maxnreg = 128
// WARPS:       k3s.kernel @kda_backward_gradients_steep <grid = [chunk, value_head], num_warps = 16

// BADWARPS: k3c ir: error: pipeline {{.*}}: lower-backward: gradients-warps must be a power of two in 1..32, got 12
// REGFILE: k3c opt: error: {{.*}}@kda_backward_gradients: maxnreg 255 at 16 warps needs 130560 registers a program, an SM has 65536: it could not launch
