// lower-to-triton on the Grams: a channel-gated Gram's loop over the blocks below the diagonal
// is unrolled (unroll = true), and a diagonal with elementwise blocks (guarded, elementwise)
// reloads their key rows and log-decays from memory (diagonal_rows = reload); a factored
// diagonal has no elementwise blocks, so no diagonal_rows; a scalar gate's Gram has no block
// loop, so neither. The printer only reads them. A Gram that already has a choice keeps it
// (diagonal_rows = extract, written by hand, prints and parses back and survives a second run).
// RUN: k3c ir %examples/kda.toml -p 'lower-recurrent,derive-chunkwise,fuse-chunkwise,derive-backward,lower-backward,outline-kernels,legalize-triton,lower-to-triton' | filecheck %s
// RUN: k3c ir %examples/kda.toml -p 'lower-recurrent,derive-chunkwise,fuse-chunkwise,outline-kernels,legalize-triton,lower-to-triton' | sed 's/diagonal_rows = reload/diagonal_rows = extract/' | k3c opt - -p lower-to-triton | filecheck %s --check-prefix=KEPT
// RUN: k3c ir %examples/gated_deltanet.toml -p 'lower-recurrent,derive-chunkwise,fuse-chunkwise,outline-kernels,legalize-triton,lower-to-triton' | filecheck %s --check-prefix=SCALAR

// CHECK:      k3s.kernel @kda_chunk_prepare
// CHECK:        %A = k3s.gram {{.*}}<mask = strict, gate = channel, beta = true, diagonal = guarded, unroll = true, diagonal_rows = reload> : !k3s.tile<C x C>
// CHECK:        %P_1 = k3s.gram {{.*}}<mask = inclusive, gate = channel, beta = false, diagonal = guarded, unroll = true, diagonal_rows = reload> : !k3s.tile<C x C>
// CHECK:      k3s.kernel @kda_backward_gradients <
// CHECK:        %A_unscaled = k3s.gram {{.*}}, %factored, {{.*}}<mask = strict, gate = channel, beta = false, diagonal = guarded, unroll = true, diagonal_rows = reload> : !k3s.tile<C x C>

// KEPT:       %A = k3s.gram {{.*}}<mask = strict, gate = channel, beta = true, diagonal = guarded, unroll = true, diagonal_rows = extract>
// KEPT:       %P_1 = k3s.gram {{.*}}<mask = inclusive, gate = channel, beta = false, diagonal = guarded, unroll = true, diagonal_rows = extract>

// SCALAR:     %A = k3s.gram %k_1, %k_1, %G, %beta_1 <mask = strict, gate = scalar, beta = true> : !k3s.tile<C x C>
// SCALAR:     %P_1 = k3s.gram %q_1, %k_1, %G <mask = inclusive, gate = scalar, beta = false> : !k3s.tile<C x C>
