// lower-backward's gradients-maxnreg: every gradients kernel's register cap (255 by default, the
// steep twin of an unbounded channel gate included), 0 none, anything else outside ptxas' range
// refused. gradients-warps: the gradients kernels' warps (twice num-warps by default), a power of two.
// RUN: k3c ir %examples/kda.toml -p 'derive-backward,lower-backward' | filecheck %s
// RUN: k3c ir %examples/kda.toml -p 'derive-backward,lower-backward' | k3c opt - | filecheck %s
// RUN: k3c ir %examples/kda.toml -p 'derive-backward,lower-backward{gradients-maxnreg=0}' | filecheck %s --check-prefix=NOCAP
// RUN: not k3c ir %examples/kda.toml -p 'derive-backward,lower-backward{gradients-maxnreg=300}' 2>&1 | filecheck %s --check-prefix=BADCAP
// RUN: k3c ir %examples/kda.toml -p 'derive-backward,lower-backward{gradients-warps=16}' | filecheck %s --check-prefix=WARPS
// RUN: not k3c ir %examples/kda.toml -p 'derive-backward,lower-backward{gradients-warps=12}' 2>&1 | filecheck %s --check-prefix=BADWARPS

// CHECK:       k3s.kernel @kda_backward_gradients <grid = [chunk, value_head], num_warps = 8, maxnreg = 255>
// CHECK:         k3s.record_check %steep_chunks, %factorable
// CHECK:         = k3s.value_block_loop <block_v = 64>
// CHECK:       k3s.kernel @kda_backward_gradients_steep <grid = [chunk, value_head], num_warps = 8, maxnreg = 255>
// CHECK-NEXT:    k3s.chunk_tile
// CHECK-NEXT:    %factorable = k3s.recorded_check %steep_chunks

// NOCAP:       k3s.kernel @kda_backward_gradients <grid = [chunk, value_head], num_warps = 8> {
// NOCAP-NOT:   maxnreg

// BADCAP: k3c ir: error: pipeline {{.*}}: lower-backward: gradients-maxnreg must be 0 (no cap) or in 24..255, got 300

// WARPS:       k3s.kernel @kda_backward_prepare <grid = [chunk, value_head], num_warps = 4
// WARPS:       k3s.kernel @kda_backward_gradients <grid = [chunk, value_head], num_warps = 16, maxnreg = 255>
// WARPS:       k3s.kernel @kda_backward_gradients_steep <grid = [chunk, value_head], num_warps = 16, maxnreg = 255>

// BADWARPS: k3c ir: error: pipeline {{.*}}: lower-backward: gradients-warps must be a power of two in 1..32, got 12
