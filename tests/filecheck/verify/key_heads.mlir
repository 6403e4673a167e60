// lower-to-triton writes the query and key heads a kernel with a head grid axis groups its value
// heads by (k3s.kernel <key_heads>, the printer's H): the layer's where a stage reads q or k rows
// (a key_head layout), else its value heads (a commit reads no key rows: H = HV). gated_deltanet
// has grouped heads (H = 16, HV = 32). It prints and parses back; a stage's verifier refuses key
// heads its tensors do not have, in one line: a key_head layout's tensor other heads, a state
// tile value heads they do not divide.
// RUN: k3c ir %examples/gated_deltanet.toml -p 'lower-recurrent,lower-decode,derive-replay,lower-speculative,derive-chunkwise,fuse-chunkwise,outline-kernels,legalize-triton,lower-to-triton' | filecheck %s
// RUN: k3c ir %examples/gated_deltanet.toml -p 'lower-recurrent,lower-decode,derive-replay,lower-speculative,derive-chunkwise,fuse-chunkwise,outline-kernels,legalize-triton,lower-to-triton' | k3c opt - | filecheck %s
// RUN: k3c ir %examples/gated_deltanet.toml -p 'lower-recurrent,lower-decode,derive-replay,lower-speculative,derive-chunkwise,fuse-chunkwise,outline-kernels,legalize-triton,lower-to-triton' | sed '/@gated_deltanet_chunk_prepare/s/key_heads = 16/key_heads = 32/' | not k3c opt - 2>&1 | filecheck %s --check-prefix=KEYS
// RUN: k3c ir %examples/gated_deltanet.toml -p 'lower-recurrent,lower-decode,derive-replay,lower-speculative,derive-chunkwise,fuse-chunkwise,outline-kernels,legalize-triton,lower-to-triton' | sed '/@gated_deltanet_commit/s/key_heads = 32/key_heads = 5/' | not k3c opt - 2>&1 | filecheck %s --check-prefix=VALUES
// RUN: k3c compile %examples/gated_deltanet.toml --stdout --no-autotune -p 'lower-recurrent,lower-decode,derive-replay,lower-speculative,outline-kernels' | filecheck %s --check-prefix=PRINTED

// CHECK:      k3s.kernel @gated_deltanet_recurrent <{{.*}}, key_heads = 16> {
// CHECK:      k3s.kernel @gated_deltanet_commit <{{.*}}, key_heads = 32> {
// CHECK:      k3s.kernel @gated_deltanet_chunk_prepare <{{.*}}, key_heads = 16> {
// CHECK:      k3s.kernel @gated_deltanet_chunk_scan <{{.*}}, key_heads = 32> {

// KEYS: k3c opt: error: {{.*}}k3s.load_chunk: %k has 16 key heads, its kernel's key_heads is 32{{$}}
// KEYS-NOT: {{.}}

// VALUES: k3c opt: error: {{.*}}k3s.state_tile: its kernel's key_heads = 5 does not divide the 32 value heads of %state{{$}}
// VALUES-NOT: {{.}}

// the commit's launch passes its key_heads as H
// PRINTED:      # k3s.kernel @gated_deltanet_commit <{{.*}}, key_heads = 32>: launch
// PRINTED-NEXT: H = 32
// PRINTED-NEXT: HV = 32
