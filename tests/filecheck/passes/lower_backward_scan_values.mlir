// lower-backward{scan-values=spill}: the values of the gradients kernel that a scan also makes
// from its carried tile are spilled by that scan, right after the stage that makes them, and
// reloaded in the gradients kernel's value-block loop: the delta residual U - W S from the state
// scan, its cotangent from the cotangent scan. The gradients kernel then no longer makes them,
// nor W, U or the query Gram that only they read. Anything but recompute / spill is refused.
// RUN: k3c ir %examples/kda.toml -p 'derive-backward,lower-backward{scan-values=spill}' | filecheck %s
// RUN: k3c ir %examples/kda.toml -p 'derive-backward,lower-backward{scan-values=spill}' | k3c opt - | filecheck %s
// RUN: k3c ir %examples/gla.toml -p 'derive-backward,lower-backward{scan-values=spill}' | filecheck %s --check-prefix=GLA
// RUN: not k3c ir %examples/kda.toml -p 'derive-backward,lower-backward{scan-values=saved}' 2>&1 | filecheck %s --check-prefix=BAD

// CHECK:       k3s.kernel @kda_backward_state_scan
// CHECK:         %[[VR:.*]] = k3s.delta_residual
// CHECK-NEXT:    k3s.spill %vr, %[[VR]]
// CHECK:       k3s.kernel @kda_backward_cotangent_scan
// CHECK:         %[[VRBAR:.*]] = k3s.add {{.*}} : !k3s.tile<C x V>
// CHECK-NEXT:    k3s.spill %vr_bar, %[[VRBAR]]
// CHECK:       k3s.kernel @kda_backward_gradients
// CHECK-NOT:     k3s.wy_apply
// CHECK-NOT:     k3s.gram %q
// CHECK:         = k3s.value_block_loop <block_v = 64>
// CHECK-NOT:     k3s.delta_residual
// CHECK:         = k3s.reload %vr :
// CHECK:         = k3s.reload %vr_bar :
// CHECK:         k3s.sum_value_blocks

// GLA-NOT:     k3s.spill %vr
// GLA:         k3s.kernel @gla_backward_gradients
// GLA-NOT:     k3s.reload %vr

// BAD: k3c ir: error: pipeline {{.*}}: lower-backward: scan-values must be one of recompute, spill, got 'saved'
