// fuse-attnres: the attnres op stays and an `aggregate` entry is added after it, with one
// kernel. A program per row (rows-per-program=1): the gain folded into the query, then one loop over the sources that
// scores (RMS folded in), updates the online softmax and accumulates the mix (carried from the
// online softmax's start: the loop's operands), then a single normalise-and-store and, when
// the caller asks for the optional output lse (training), the row's log-sum-exp; those stages
// take the entry's arguments they read or write (query, gain, sources, out, lse) as operands.
// The entry bounds the sources by num_blocks + 1 (blocks + partial sum).
// RUN: k3c opt %s -p 'fuse-attnres{rows-per-program=1}' | filecheck %s
// RUN: k3c opt %s -p 'fuse-attnres{rows-per-program=1}' | k3c opt - | filecheck %s
// RUN: k3c opt %s -p 'fuse-attnres{rows-per-program=1}' --generic | k3c opt - | filecheck %s
// The source loop is software-pipelined (num_stages): the next sources' rows load while one is
// scored; by default 3 stages for a program per row, 4 for a group of rows.
// RUN: k3c opt %s -p 'fuse-attnres{rows-per-program=1 num-warps=8 num-stages=1}' | filecheck %s --check-prefix=WARPS
// RUN: not k3c opt %s -p 'fuse-attnres{num-stages=-1}' 2>&1 | filecheck %s --check-prefix=STAGES
// rows-per-program (default 8): a program walks its group of rows' (row, source) pairs as one
// loop; the running max restarts at each row's first source, the stores follow each row's last.
// RUN: k3c opt %s -p fuse-attnres | filecheck %s --check-prefix=ROWS
// RUN: k3c opt %s -p fuse-attnres --generic | k3c opt - | filecheck %s --check-prefix=ROWS
// RUN: k3c opt %s -p 'fuse-attnres{rows-per-program=4 num-stages=2}' | filecheck %s --check-prefix=ROWS4
// By default the entry has both kernels: the per-row one launched by calls of fewer than
// grouped-from-rows (2048) token rows, the grouped one by the others (k3s.kernel min_rows /
// max_rows); grouped-from-rows=0: the grouped kernel alone, at every call.
// RUN: k3c opt %s -p fuse-attnres | filecheck %s --check-prefix=SPLIT
// RUN: k3c opt %s -p 'fuse-attnres{grouped-from-rows=0}' | filecheck %s --check-prefix=GROUPED
// RUN: not k3c opt %s -p 'fuse-attnres{grouped-from-rows=-1}' 2>&1 | filecheck %s --check-prefix=BADSPLIT
// RUN: not k3c opt %s -p 'fuse-attnres{rows-per-program=0}' 2>&1 | filecheck %s --check-prefix=BADROWS

builtin.module {
  k3.attnres @ar <hidden_size = 96, num_blocks = 6, block_size = 4, eps = 0.0001, dtype = bfloat16>
}

// CHECK:      builtin.module {
// CHECK-NEXT:   k3.attnres @ar <hidden_size = 96, num_blocks = 6, block_size = 4, eps = 0.0001, dtype = bfloat16>
// CHECK-NEXT:   k3s.entry @aggregate <source = @ar, max_sources = 7> {
// CHECK-NEXT:     %sources = k3s.tensor_arg @sources <role = input> : !k3s.tensor<S x B x T x 96, float>
// CHECK-NEXT:     %query = k3s.tensor_arg @query <role = input> : !k3s.tensor<96, float>
// CHECK-NEXT:     %gain = k3s.tensor_arg @gain <role = input> : !k3s.tensor<96, float>
// CHECK-NEXT:     %out = k3s.tensor_arg @out <role = output> : !k3s.tensor<B x T x 96, float>
// CHECK-NEXT:     %lse = k3s.tensor_arg @lse <role = optional_output> : !k3s.tensor<B x T, float32>
// CHECK-NEXT:     k3s.kernel @ar_aggregate <grid = [row], num_warps = 4, num_stages = 3> {
// CHECK-NEXT:       %q = k3s.fold_query %query, %gain <hidden_size = 96> : !k3s.tile<D>
// CHECK-NEXT:       %max, %sum, %acc = k3s.softmax_start : !k3s.tile<>, !k3s.tile<>, !k3s.tile<D>
// CHECK-NEXT:       %max_1, %sum_1, %acc_1 = k3s.source_loop %max, %sum, %acc {
// CHECK-NEXT:       ^bb0(%max_2: !k3s.tile<>, %sum_2: !k3s.tile<>, %acc_2: !k3s.tile<D>):
// CHECK-NEXT:         %x = k3s.load_source %sources : !k3s.tile<D>
// CHECK-NEXT:         %score = k3s.rms_score %x, %q <eps = 0.0001> : !k3s.tile<>
// CHECK-NEXT:         %max_3, %sum_3, %p, %rescale = k3s.online_softmax %max_2, %sum_2, %score : !k3s.tile<>, !k3s.tile<>, !k3s.tile<>, !k3s.tile<>
// CHECK-NEXT:         %acc_3 = k3s.mix_accumulate %acc_2, %rescale, %p, %x : !k3s.tile<D>
// CHECK-NEXT:         k3s.next_source %max_3, %sum_3, %acc_3
// CHECK-NEXT:       } : !k3s.tile<>, !k3s.tile<>, !k3s.tile<D>
// CHECK-NEXT:       k3s.normalize_store %acc_1, %sum_1, %out
// CHECK-NEXT:       k3s.store_lse %max_1, %sum_1, %lse
// CHECK-NEXT:     }
// CHECK-NEXT:   }
// CHECK-NEXT: }

// WARPS: k3s.kernel @ar_aggregate <grid = [row], num_warps = 8, num_stages = 1> {
// STAGES: {{^}}k3c opt: error: pipeline 'fuse-attnres{num-stages=-1}': fuse-attnres: num-stages must be >= 1 (0: by rows-per-program), got -1{{$}}

// ROWS:      k3s.kernel @ar_aggregate_groups <grid = [row_group], num_warps = 4, num_stages = 4, min_rows = 2048> {
// ROWS:        %max_1, %sum_1, %acc_1 = k3s.row_source_loop %max, %sum, %acc <rows = 8> {
// ROWS-NEXT:   ^bb0(%max_2: !k3s.tile<>, %sum_2: !k3s.tile<>, %acc_2: !k3s.tile<D>):
// ROWS-NEXT:     %max_3 = k3s.row_start %max_2 : !k3s.tile<>
// ROWS-NEXT:     %x = k3s.load_source %sources : !k3s.tile<D>
// ROWS:          %max_4, %sum_3, %p, %rescale = k3s.online_softmax %max_3, %sum_2, %score
// ROWS-NEXT:     %acc_3 = k3s.mix_accumulate %acc_2, %rescale, %p, %x : !k3s.tile<D>
// ROWS-NEXT:     k3s.at_row_end {
// ROWS-NEXT:       k3s.normalize_store %acc_3, %sum_3, %out
// ROWS-NEXT:       k3s.store_lse %max_4, %sum_3, %lse
// ROWS-NEXT:     }
// ROWS-NEXT:     k3s.next_source %max_4, %sum_3, %acc_3
// ROWS-NEXT:   } : !k3s.tile<>, !k3s.tile<>, !k3s.tile<D>
// ROWS-NEXT: }
// ROWS-NEXT: }
// ROWS4:      k3s.kernel @ar_aggregate_groups <grid = [row_group], num_warps = 4, num_stages = 2, min_rows = 2048> {
// ROWS4:        k3s.row_source_loop %max, %sum, %acc <rows = 4> {
// SPLIT:      k3s.entry @aggregate <source = @ar, max_sources = 7> {
// SPLIT:        k3s.kernel @ar_aggregate <grid = [row], num_warps = 4, num_stages = 3, max_rows = 2047> {
// SPLIT:          k3s.source_loop
// SPLIT:        k3s.kernel @ar_aggregate_groups <grid = [row_group], num_warps = 4, num_stages = 4, min_rows = 2048> {
// SPLIT:          k3s.row_source_loop
// GROUPED:     k3s.entry @aggregate
// GROUPED-NOT: k3s.source_loop
// GROUPED:     k3s.kernel @ar_aggregate_groups <grid = [row_group], num_warps = 4, num_stages = 4> {
// BADSPLIT: {{^}}k3c opt: error: pipeline 'fuse-attnres{grouped-from-rows=-1}': fuse-attnres: grouped-from-rows must be >= 0 (0: always grouped), got -1{{$}}
// BADROWS: {{^}}k3c opt: error: pipeline 'fuse-attnres{rows-per-program=0}': fuse-attnres: rows-per-program must be >= 1, got 0{{$}}
