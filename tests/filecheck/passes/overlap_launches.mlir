// overlap-launches: the backward's state and cotangent scans share only what they reload, so the
// first runs on the side stream between a fork and a join; the prepare before them and the
// gradients kernel after them (which reload what they spill) stay in order. The IR parses back.
// RUN: k3c ir %examples/kda.toml -p 'derive-backward,lower-backward,outline-kernels,overlap-launches' | filecheck %s
// RUN: k3c ir %examples/kda.toml -p 'derive-backward,lower-backward,outline-kernels,overlap-launches' | k3c opt - | filecheck %s
// RUN: k3c ir %examples/kda.toml -p 'derive-backward,lower-backward{gradients-forward=reload},outline-kernels' | filecheck %s --check-prefix=RELOAD

// CHECK:       k3s.entry @chunk_backward
// CHECK:         k3s.launch @kda_backward_prepare
// CHECK-NEXT:    k3s.fork_streams
// CHECK-NEXT:    k3s.launch @kda_backward_state_scan {{.*}}<side_stream = true>
// CHECK-NEXT:    k3s.launch @kda_backward_cotangent_scan
// CHECK-NOT:     side_stream
// CHECK-NEXT:    k3s.join_streams
// CHECK-NEXT:    k3s.launch @kda_backward_gradients

// gradients-forward=reload: the gradients kernel reloads the inverse and the Grams, makes none
// RELOAD:      k3s.kernel @kda_backward_gradients
// RELOAD-NOT:  k3s.gram
// RELOAD:      k3s.reload %T_inverse
// RELOAD-NOT:  k3s.unit_lower_inverse
// RELOAD:      k3s.kernel @kda_backward_gradients_steep
