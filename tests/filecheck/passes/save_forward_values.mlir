// save-forward-values: where chunk_backward's prepare writes only workspaces that chunk's prepare
// writes (same names, types and chunk size), a training forward `chunk_saving` returns them as
// outputs (the per-chunk one zero-filled: its spare slots are never written) and
// `chunk_backward_saved` takes them as inputs, without its prepare kernel. GLA's backward
// prepare writes fewer than its forward's: only those are saved (P stays a workspace). With
// derive-backward at another chunk size, nothing is added; after outline-kernels, an error.
// RUN: k3c ir %examples/kda.toml -p 'derive-chunkwise,fuse-chunkwise,derive-backward,lower-backward,save-forward-values' | filecheck %s
// RUN: k3c ir %examples/kda.toml -p 'derive-chunkwise,fuse-chunkwise,derive-backward,lower-backward,save-forward-values' | k3c opt - | filecheck %s
// RUN: k3c ir %examples/gla.toml -p 'derive-chunkwise,fuse-chunkwise,derive-backward,lower-backward,save-forward-values' | filecheck %s --check-prefix=GLA
// RUN: k3c ir %examples/kda.toml -p 'derive-chunkwise,fuse-chunkwise,derive-backward{chunk-size=32},lower-backward,save-forward-values' | filecheck %s --check-prefix=DIFFER
// RUN: not k3c ir %examples/kda.toml -p 'derive-chunkwise,fuse-chunkwise,derive-backward,lower-backward,outline-kernels,save-forward-values' 2>&1 | filecheck %s --check-prefix=OUTLINED

// CHECK:       k3s.entry @chunk_backward <source = @kda>
// CHECK:       k3s.kernel @kda_backward_prepare
// CHECK:       k3s.entry @chunk_saving <source = @kda>
// CHECK:         %KG = k3s.tensor_arg @KG <role = output>
// CHECK:         %P = k3s.tensor_arg @P <role = output>
// CHECK:         %gamma_C = k3s.tensor_arg @gamma_C <role = output, fill = 0>
// CHECK:         k3s.kernel @kda_chunk_prepare_saving
// CHECK:         k3s.kernel @kda_chunk_scan_saving
// CHECK:       k3s.entry @chunk_backward_saved <source = @kda>
// CHECK:         %KG = k3s.tensor_arg @KG <role = input>
// CHECK:         %gamma_C = k3s.tensor_arg @gamma_C <role = input>
// CHECK-NOT:     k3s.kernel @kda_backward_prepare
// CHECK:         k3s.kernel @kda_backward_state_scan_saved
// CHECK:         k3s.kernel @kda_backward_cotangent_scan_saved
// CHECK:         k3s.kernel @kda_backward_gradients_saved

// GLA:         k3s.entry @chunk_saving <source = @gla>
// GLA:           %KG = k3s.tensor_arg @KG <role = output>
// GLA:           %P = k3s.tensor_arg @P <role = workspace>
// GLA:         k3s.entry @chunk_backward_saved <source = @gla>
// GLA-NOT:       @P
// GLA:           %QG = k3s.tensor_arg @QG <role = input>

// DIFFER-NOT:  @chunk_saving

// OUTLINED: k3c ir: error: pipeline {{.*}}: save-forward-values: the kernels of @kda's entries are outlined already; run it before outline-kernels
