// lower-to-triton gives every float tensor an entry allocates the dtype of its first tensor
// argument (`dtype_of = @q`), which the printer reads; the verifier refuses a dtype_of that names
// no float tensor the caller passes, in one line.
// RUN: k3c ir %examples/gla.toml -p 'lower-recurrent,derive-chunkwise,fuse-chunkwise,outline-kernels,legalize-triton,lower-to-triton' | filecheck %s
// RUN: k3c ir %examples/gla.toml -p 'lower-recurrent,derive-chunkwise,fuse-chunkwise,outline-kernels,legalize-triton,lower-to-triton' | sed 's/@o <role = output, dtype_of = @q>/@o <role = output, dtype_of = @cu_seqlens>/' | not k3c opt - 2>&1 | filecheck %s --check-prefix=OFFSETS

// CHECK:     k3s.entry @chunk
// CHECK:       k3s.tensor_arg @o <role = output, dtype_of = @q> : !k3s.tensor<B x T x 16 x 128, float>
// CHECK-NOT:   k3s.tensor_arg @final_state <{{.*}}dtype_of

// OFFSETS: k3c opt: error: {{.*}}k3s.tensor_arg @o: dtype_of = @cu_seqlens: a float tensor the entry allocates takes the dtype of a float tensor the caller passes{{$}}
// OFFSETS-NOT: {{.}}
