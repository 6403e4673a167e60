// Spec-driven: the IR `k3c ir` prints for every example re-parses with `k3c opt` to the same
// text, and `k3c ir --after-all --generic` works (it re-parses every snapshot). A regression
// test: the AttnRes and LatentMoE examples (eps = 1e-06) used to print unparseable floats.
// RUN: k3c ir %examples/attnres.toml > %t.ar && k3c opt %t.ar | diff %t.ar -
// RUN: k3c ir %examples/latent_moe.toml > %t.moe && k3c opt %t.moe | diff %t.moe -
// RUN: k3c ir %examples/latent_moe_mxfp4.toml > %t.mx && k3c opt %t.mx | diff %t.mx -
// RUN: k3c ir %examples/kda.toml > %t.kda && k3c opt %t.kda | diff %t.kda -
// RUN: k3c ir %examples/attnres.toml | k3c opt - -p fuse-attnres | k3c opt - | filecheck %s --check-prefix=AR
// RUN: k3c ir %examples/latent_moe.toml | k3c opt - | filecheck %s --check-prefix=MOE
// RUN: k3c ir %examples/attnres.toml --after-all --generic | filecheck %s --check-prefix=GENERIC

// AR: %score = k3s.rms_score %x, %q <eps = 1.0e-06> : !k3s.tile<>
// MOE: k3.latent_moe @latent_moe <{{.*}} eps = 1.0e-06, dtype = bfloat16>
// GENERIC-LABEL: // -----// IR after fuse-attnres //----- //
// GENERIC: %score = "k3s.rms_score"(%x, %q) <{eps = 1.000000e-06 : f64}> : (!k3s.tile<D>, !k3s.tile<D>) -> !k3s.tile<>
