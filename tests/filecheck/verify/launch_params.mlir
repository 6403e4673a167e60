// lower-to-triton writes what each kernel's launch passes besides its arguments (launch_params:
// the chunk axis's table, the run-time sizes its stages read, the checkpoints a
// k3s.store_checkpoint writes, in the order the printed kernel takes them), and the value each
// entry passes for a run-time size (k3s.launch_size: the token rows R are B x T where the entry's
// tensors are [B, T, ..]). The verifier refuses launch_params its grid and stages do not read, and
// a launch_size of no run-time size, in one line.
// RUN: k3c ir %examples/kda.toml -p 'lower-recurrent,derive-chunkwise,fuse-chunkwise,outline-kernels,legalize-triton,lower-to-triton' | filecheck %s
// RUN: k3c ir %examples/kda.toml -p 'lower-recurrent,derive-chunkwise,fuse-chunkwise,outline-kernels,legalize-triton,lower-to-triton' | k3c opt - | filecheck %s
// RUN: k3c ir %examples/attnres.toml -p 'fuse-attnres,outline-kernels,legalize-triton,lower-to-triton' | filecheck %s --check-prefix=ROWS
// RUN: k3c ir %examples/kda.toml -p 'lower-recurrent,derive-chunkwise,fuse-chunkwise,outline-kernels,legalize-triton,lower-to-triton' | sed 's/launch_params = \[T, checkpoints\]/launch_params = [T]/' | not k3c opt - 2>&1 | filecheck %s --check-prefix=STALE
// RUN: k3c ir %examples/kda.toml -p 'lower-recurrent,derive-chunkwise,fuse-chunkwise,outline-kernels,legalize-triton,lower-to-triton' | sed 's/<size = T>/<size = chunk_table>/' | not k3c opt - 2>&1 | filecheck %s --check-prefix=NOT-A-SIZE

// CHECK:      k3s.kernel @kda_recurrent <{{.*}}, launch_params = [T], key_heads = 32>
// CHECK:      k3s.kernel @kda_chunk_prepare <{{.*}}, launch_params = [chunk_table, T], key_heads = 32>
// CHECK:      k3s.kernel @kda_chunk_scan <{{.*}}, launch_params = [T, checkpoints], key_heads = 32>
// CHECK:      k3s.entry @chunk
// CHECK:        k3s.bind_size %NC <symbol = NC>
// CHECK-NEXT:   %T_1 = k3s.size <symbol = T> : index
// CHECK-NEXT:   k3s.launch_size %T_1 <size = T>
// CHECK-NEXT:   k3s.launch @kda_chunk_prepare

// ROWS:      k3s.kernel @attnres_aggregate <{{.*}}, launch_params = [S, R]>
// ROWS:      k3s.entry @aggregate
// ROWS:        %S = k3s.size <symbol = S> : index
// ROWS-NEXT:   k3s.launch_size %S <size = S>
// ROWS-NEXT:   %B = k3s.size <symbol = B> : index
// ROWS-NEXT:   %T = k3s.size <symbol = T> : index
// ROWS-NEXT:   %0 = arith.muli %B, %T : index
// ROWS-NEXT:   k3s.launch_size %0 <size = R>

// STALE: k3c opt: error: {{.*}}k3s.kernel @kda_chunk_scan: its launch_params [T] must be those its grid and stages read, [T, checkpoints]{{$}}
// STALE-NOT: {{.}}

// NOT-A-SIZE: k3c opt: error: {{.*}}k3s.launch_size: size is a run-time size, one of T, S, R, Q, HS, NSLOTS; got chunk_table{{$}}
// NOT-A-SIZE-NOT: {{.}}
