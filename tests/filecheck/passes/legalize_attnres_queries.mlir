// legalize-triton fixes a Block AttnRes program's block of queries as its kernel's block_q: the
// fold's `queries` (a fixed block of the block's queries), or, where a program holds all the
// call's (the columns forms' folded queries and d mixes, the backward's queries' kernel),
// #k3s.runtime_block<Q, least = 16>: the next power of two of the call's Q, set at launch, at
// least 16 since tl.dot takes the queries as operands. The attribute prints and parses back (k3c opt), and the printer prints it
// as the launch's expression of dims["Q"].
// RUN: k3c ir %examples/attnres.toml -p 'fuse-attnres,derive-attnres-backward,derive-block-attnres{partials-schedule=columns},derive-block-attnres-backward{partials-backward=columns},outline-kernels,legalize-triton' | filecheck %s --check-prefix=COLUMNS
// RUN: k3c ir %examples/attnres.toml -p 'fuse-attnres,derive-attnres-backward,derive-block-attnres{partials-schedule=columns},derive-block-attnres-backward{partials-backward=columns},outline-kernels,legalize-triton' | k3c opt - | filecheck %s --check-prefix=COLUMNS
// RUN: k3c ir %examples/attnres.toml -p 'fuse-attnres,derive-attnres-backward,derive-block-attnres,derive-block-attnres-backward,outline-kernels,legalize-triton' | filecheck %s --check-prefix=BLOCKS
// RUN: k3c compile %examples/attnres.toml --stdout --no-autotune -p 'fuse-attnres,derive-attnres-backward,derive-block-attnres{partials-schedule=columns},derive-block-attnres-backward{partials-backward=columns},outline-kernels' | filecheck %s --check-prefix=TRITON

// COLUMNS: k3s.kernel @attnres_block_partials_columns <{{.*}}, block_q = #k3s.runtime_block<Q, least = 16>>
// COLUMNS: k3s.kernel @attnres_block_partials_backward_columns <{{.*}}, block_q = #k3s.runtime_block<Q, least = 16>>
// COLUMNS: k3s.kernel @attnres_block_partials_backward_queries <{{.*}}, block_d = 128, block_r = 256, block_q = #k3s.runtime_block<Q, least = 16>>

// BLOCKS: k3s.kernel @attnres_block_partials <{{.*}}, block_q = 2>
// BLOCKS: k3s.kernel @attnres_block_partials_backward <{{.*}}, block_q = 1>

// TRITON: BQ = max(16, triton.next_power_of_2(dims["Q"]))
// TRITON: BQ = max(16, triton.next_power_of_2(dims["Q"]))
// TRITON: BQ = max(16, triton.next_power_of_2(dims["Q"]))
