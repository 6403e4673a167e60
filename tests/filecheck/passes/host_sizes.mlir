// lower-to-triton writes the shape symbols an entry computes on the host before it allocates as
// index arithmetic (xDSL's arith on index values) ending in k3s.bind_size: NC = cdiv(B T, C) + N
// per-chunk slots, an MoE dispatch plan's PB = cdiv(R k, BM) + min(R k, E) blocks and
// PP = PB BM positions, and the router's hidden slices HS by the call's rows (k3s.size_by_rows,
// from its kernel's k3s.launch_by_rows ops). The printer prints each bound size as one Python expression. The ops print
// and parse back, and a second run adds none.
// RUN: k3c ir %examples/kda.toml -p 'lower-recurrent,derive-chunkwise,fuse-chunkwise,derive-backward,lower-backward,outline-kernels,legalize-triton,lower-to-triton' | filecheck %s --check-prefix=NC
// RUN: k3c ir %examples/kda.toml -p 'lower-recurrent,derive-chunkwise,fuse-chunkwise,derive-backward,lower-backward,outline-kernels,legalize-triton,lower-to-triton' | k3c opt - -p lower-to-triton | filecheck %s --check-prefix=NC
// RUN: k3c ir %examples/latent_moe.toml -p 'lower-moe-routing,lower-moe-experts,outline-kernels,legalize-triton,lower-to-triton' | filecheck %s --check-prefix=PB
// RUN: k3c compile %examples/kda.toml --stdout --no-autotune -p 'lower-recurrent,derive-chunkwise,fuse-chunkwise,outline-kernels' | filecheck %s --check-prefix=TRITON

// NC:      k3s.entry @chunk
// NC:        %B = k3s.size <symbol = B> : index
// NC-NEXT:   %T = k3s.size <symbol = T> : index
// NC-NEXT:   %0 = arith.muli %B, %T : index
// NC-NEXT:   %c16 = arith.constant 16 : index
// NC-NEXT:   %1 = arith.ceildivsi %0, %c16 : index
// NC-NEXT:   %N = k3s.size <symbol = N> : index
// NC-NEXT:   %NC = arith.addi %1, %N : index
// NC-NEXT:   k3s.bind_size %NC <symbol = NC>
// NC-NOT:    k3s.bind_size %NC
// NC:        k3s.entry @chunk_backward
// NC:        k3s.bind_size %NC <symbol = NC>
// NC-NOT:    k3s.bind_size

// PB:      k3s.entry @route
// PB:        %HS = k3s.size_by_rows <max_rows = [16, 128], sizes = [8, 4], otherwise = 1> : index
// PB-NEXT:   k3s.bind_size %HS <symbol = HS>
// PB:      k3s.entry @moe_prefill
// PB:        %R = k3s.size <symbol = R> : index
// PB-NEXT:   %c16 = arith.constant 16 : index
// PB-NEXT:   %pairs = arith.muli %R, %c16 : index
// PB-NEXT:   %c128 = arith.constant 128 : index
// PB-NEXT:   %0 = arith.ceildivsi %pairs, %c128 : index
// PB-NEXT:   %c896 = arith.constant 896 : index
// PB-NEXT:   %1 = arith.minsi %pairs, %c896 : index
// PB-NEXT:   %PB = arith.addi %0, %1 : index
// PB-NEXT:   k3s.bind_size %PB <symbol = PB>
// PB-NEXT:   %PB_1 = k3s.size <symbol = PB> : index
// PB-NEXT:   %PP = arith.muli %PB_1, %c128 : index
// PB-NEXT:   k3s.bind_size %PP <symbol = PP>

// TRITON-LABEL: def chunk(
// TRITON:         dims["NC"] = triton.cdiv(dims["B"] * dims["T"], 16) + dims["N"]
