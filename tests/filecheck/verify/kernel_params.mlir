// A kernel's parameters are what the IR gives it, each read by its code, so the printer keeps
// them all (it no longer trims them to the names its printed code reads): its arguments, its
// launch_params (a chunk axis's table only where its chunk tile has sequence offsets, a run-time
// size only where a stage reads it: an expert's weight gradient loops over its run of the sorted
// pair list, not the call's R rows), its stages' constants, the presence flags of the optional
// tensors its launch passes, its flags, and DOT where lower-to-triton wrote dots, on a kernel
// with a stage that multiplies (gla's summary prepare only gates and spills; a projection of one
// pair's row is a vector product). The verifier refuses launch_params the kernel does not read,
// in one line.
// RUN: k3c ir %examples/deltanet.toml -p 'lower-recurrent,derive-replay{draft-tokens=8},lower-speculative{verify=chunked},outline-kernels,legalize-triton,lower-to-triton' | k3c opt - | filecheck %s
// RUN: k3c ir %examples/deltanet.toml -p 'lower-recurrent,derive-replay{draft-tokens=8},lower-speculative{verify=chunked},outline-kernels,legalize-triton,lower-to-triton' | sed '/@deltanet_verify_prepare/s/launch_params = \[T\]/launch_params = [chunk_table, T]/' | not k3c opt - 2>&1 | filecheck %s --check-prefix=STALE
// RUN: k3c compile %examples/deltanet.toml --stdout --no-autotune -p 'lower-recurrent,derive-replay{draft-tokens=8},lower-speculative{verify=chunked},outline-kernels' | filecheck %s --check-prefix=PRINTED
// RUN: k3c ir %examples/gla.toml -p 'lower-recurrent,derive-chunkwise,fuse-chunkwise,derive-segment-scan,lower-segment-scan,outline-kernels,legalize-triton,lower-to-triton' | k3c opt - | filecheck %s --check-prefix=GLA
// RUN: k3c ir %examples/latent_moe.toml -p 'lower-moe-routing,lower-moe-experts,derive-moe-backward,outline-kernels,legalize-triton,lower-to-triton' | k3c opt - | filecheck %s --check-prefix=MOE

// CHECK: k3s.kernel @deltanet_verify_prepare <grid = [chunk, value_head], {{.*}}, launch_params = [T], key_heads = 16> {

// STALE: k3c opt: error: {{.*}}k3s.kernel @deltanet_verify_prepare: its launch_params [chunk_table, T] must be those its grid and stages read, [T]{{$}}
// STALE-NOT: {{.}}

// PRINTED-LABEL: def deltanet_verify_prepare_kernel(
// PRINTED-NOT:   chunk_table
// PRINTED:       DOT: tl.constexpr,
// PRINTED-NEXT:  ):

// GLA: k3s.kernel @gla_summary_prepare <grid = [chunk, value_head], num_warps = 4, block_k = 128, block_v = 128, launch_params = [chunk_table, T], key_heads = 16> {

// MOE: k3s.kernel @latent_moe_decode_pair_gate_up <grid = [pair, column_block], num_warps = 4, block_d = 256, block_n = 32, launch_params = []> {
// MOE: k3s.kernel @latent_moe_backward_expert_down_wgrad <grid = [input_block, column_block, expert], {{.*}}, launch_params = []> {
