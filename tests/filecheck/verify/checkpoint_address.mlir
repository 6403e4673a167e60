// lower-to-triton writes where a checkpoint's state goes (k3s.store_checkpoint <address>): the
// slot's row of the checkpoints, the value head, then the state's columns in its layout (kv:
// column[K], column[V]; gla's vk: column[V], column[K]); the printer prints the store from it (gla's below) with
// common.tensor_address. It prints and parses back; the verifier refuses an address that does not
// fit the state's layout, in one line.
// RUN: k3c ir %examples/kda.toml -p 'lower-recurrent,derive-chunkwise,fuse-chunkwise,outline-kernels,legalize-triton,lower-to-triton' | filecheck %s
// RUN: k3c ir %examples/kda.toml -p 'lower-recurrent,derive-chunkwise,fuse-chunkwise,outline-kernels,legalize-triton,lower-to-triton' | k3c opt - | filecheck %s
// RUN: k3c ir %examples/gla.toml -p 'lower-recurrent,derive-chunkwise,fuse-chunkwise,outline-kernels,legalize-triton,lower-to-triton' | k3c opt - | filecheck %s --check-prefix=VK
// RUN: k3c ir %examples/kda.toml -p 'lower-recurrent,derive-chunkwise,fuse-chunkwise,outline-kernels,legalize-triton,lower-to-triton' | sed '/store_checkpoint/s/column\[K\], column\[V\]>>/column[V], column[K]>>/' | not k3c opt - 2>&1 | filecheck %s --check-prefix=WRONG
// RUN: k3c compile %examples/gla.toml --stdout --no-autotune | filecheck %s --check-prefix=PRINTED

// CHECK:      k3s.kernel @kda_chunk_scan
// CHECK:        k3s.store_checkpoint %S_2 <layout = kv, address = #k3s.layout<checkpoint[NCK], head[HV], column[K], column[V]>>

// VK:         k3s.kernel @gla_chunk_scan
// VK:           k3s.store_checkpoint %S_2 <layout = vk, address = #k3s.layout<checkpoint[NCK], head[HV], column[V], column[K]>>

// WRONG: k3c opt: error: {{.*}}k3s.store_checkpoint: address #k3s.layout<checkpoint[NCK], head[HV], column[V], column[K]> does not fit its <K x V> state in layout kv, expected #k3s.layout<checkpoint[NCK], head[HV], column[K], column[V]>{{$}}
// WRONG-NOT: {{.}}

// PRINTED:    tl.store(checkpoints + (slot * HV + i_hv) * V * K + o_v[None, :] * K + o_k[:, None], b_S, mask=m_k[:, None] & m_v[None, :])
