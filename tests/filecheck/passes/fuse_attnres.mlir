// fuse-attnres: the attnres op stays and an `aggregate` entry is added after it, with one
// row-parallel kernel: the gain folded into the query, then one loop over the sources that
// scores (RMS folded in), updates the online softmax and accumulates the mix, then a single
// normalise-and-store. The entry bounds the sources by num_blocks + 1 (blocks + partial sum).
// RUN: k3c opt %s -p fuse-attnres | filecheck %s
// RUN: k3c opt %s -p fuse-attnres | k3c opt - | filecheck %s
// RUN: k3c opt %s -p fuse-attnres --generic | k3c opt - | filecheck %s
// RUN: k3c opt %s -p 'fuse-attnres{num-warps=4}' | filecheck %s --check-prefix=WARPS

builtin.module {
  k3.attnres @ar <hidden_size = 96, num_blocks = 6, block_size = 4, eps = 0.0001, dtype = bfloat16>
}

// CHECK:      builtin.module {
// CHECK-NEXT:   k3.attnres @ar <hidden_size = 96, num_blocks = 6, block_size = 4, eps = 0.0001, dtype = bfloat16>
// CHECK-NEXT:   k3s.entry @aggregate <source = ar, max_sources = 7> {
// CHECK-NEXT:     k3s.tensor_arg @sources <shape = "S,B,T,96", dtype = float, role = input>
// CHECK-NEXT:     k3s.tensor_arg @query <shape = "96", dtype = float, role = input>
// CHECK-NEXT:     k3s.tensor_arg @gain <shape = "96", dtype = float, role = input>
// CHECK-NEXT:     k3s.tensor_arg @out <shape = "B,T,96", dtype = float, role = output>
// CHECK-NEXT:     k3s.kernel @ar_aggregate <grid = row, num_warps = 8> {
// CHECK-NEXT:       k3s.fold_query <hidden_size = 96>
// CHECK-NEXT:       k3s.source_loop {
// CHECK-NEXT:         k3s.rms_score <eps = 0.0001>
// CHECK-NEXT:         k3s.online_softmax
// CHECK-NEXT:         k3s.mix_accumulate
// CHECK-NEXT:       }
// CHECK-NEXT:       k3s.normalize_store
// CHECK-NEXT:     }
// CHECK-NEXT:   }
// CHECK-NEXT: }

// WARPS: k3s.kernel @ar_aggregate <grid = row, num_warps = 4> {
