// derive-block-attnres: the attnres op stays and two entries are added after it, Block AttnRes's
// two phases, each fuse-attnres's aggregate kernel with its loop over the sources split:
// - block_partials: the aggregate's loop over a block's completed representatives, batched over
//   the block's queries (every value of the query gains the tile dimension Q: the fold of the
//   program's block of queries, the scores, the online softmax, the mix and what the loop
//   carries; the representative's row does not, so each is read once for all the program's
//   queries), and what the loop leaves stored as its log-sum-exp and normalised mix in the
//   activations' dtype (k3s.store_normalised_partials; `partials=numerator`: as it stands,
//   k3s.store_partials). A program per token row and block of queries (grid row_query_block);
//   with `rows-per-program=8` the aggregate's grouped kernel (a program's rows and their sources
//   as one loop, the partials stored at each row's end, the queries folded once for all its
//   rows: grid row_group_query_block); at most num_blocks representatives.
// - block_merge: the loop started from one query's partials (k3s.load_normalised_partials, or
//   k3s.load_partials, where the aggregate has k3s.softmax_start) over the one source after
//   them, the block's partial sum, and the aggregate's normalised store and optional log-sum-exp
//   store (for the backward); nothing to pipeline.
// RUN: k3c opt %s -p 'derive-block-attnres{partials-schedule=query-blocks}' | filecheck %s
// RUN: k3c opt %s -p 'derive-block-attnres{partials-schedule=query-blocks}' | k3c opt - | filecheck %s
// RUN: k3c opt %s -p 'derive-block-attnres{partials-schedule=query-blocks}' --generic | k3c opt - | filecheck %s
// Phase 1 in blocks of columns (partials-schedule=columns, an option until timed on a GPU): the queries folded once a call (a kernel of
// their own, split in two parts of the activations' dtype), then a program per group of rows
// sweeping the columns twice: the Gram matrix and the queries' dots carried through the first
// sweep, the softmax between the sweeps, the mixes stored on the second (last block first).
// RUN: k3c opt %s -p 'derive-block-attnres{partials-schedule=columns}' | filecheck %s --check-prefix=COLUMNS
// RUN: k3c opt %s -p 'derive-block-attnres{partials-schedule=columns}' --generic | k3c opt - | filecheck %s --check-prefix=COLUMNS
// After fuse-attnres and derive-attnres-backward (the default pipeline's order) the two phases
// follow the aggregate's entries; running the pass again adds nothing.
// RUN: k3c opt %s -p fuse-attnres,derive-attnres-backward,derive-block-attnres,derive-block-attnres | filecheck %s --check-prefix=ORDER
// The program's block of queries: by default the most (at most 32) whose rows ([BQ, D] queries
// and mixes, a representative's row) fit what the aggregate's backward holds, six rows of 8192
// fp32; a row of 9000 columns (16384 padded) leaves one query a program, in 16 warps.
// RUN: k3c opt %s -p 'derive-block-attnres{partials-schedule=query-blocks queries-per-program=2}' | filecheck %s --check-prefix=OPTS
// RUN: k3c opt %s -p 'derive-block-attnres{partials-schedule=query-blocks}' | filecheck %s --check-prefix=WIDE
// RUN: not k3c opt %s -p 'derive-block-attnres{queries-per-program=3}' 2>&1 | filecheck %s --check-prefix=POW2
// The numerator form: m, z and a stored and loaded as the loop carries them, in fp32.
// RUN: k3c opt %s -p 'derive-block-attnres{partials-schedule=query-blocks partials=numerator}' | filecheck %s --check-prefix=NUMERATOR
// Groups of rows: both phases from the aggregate's two kernels, split at grouped-from-rows (2048)
// as fuse-attnres splits them; the grouped block_partials stores each row's partials at its end,
// the grouped block_merge resumes each row from its own partials at its first source
// (k3s.row_resume where the aggregate restarts at -inf).
// RUN: k3c opt %s -p 'derive-block-attnres{partials-schedule=query-blocks rows-per-program=8}' | filecheck %s --check-prefix=GROUPS
// RUN: not k3c opt %s -p 'derive-block-attnres{rows-per-program=0}' 2>&1 | filecheck %s --check-prefix=ROWS0
// RUN: not k3c opt %s -p 'derive-block-attnres{grouped-from-rows=-1}' 2>&1 | filecheck %s --check-prefix=SPLIT
// RUN: not k3c opt %s -p 'derive-block-attnres{partials=fp32}' 2>&1 | filecheck %s --check-prefix=PARTIALS
// The partials' stages and the fold of a block of queries verify their tiles and tensors (one line each).
// RUN: k3c opt %s -p 'derive-block-attnres{partials-schedule=query-blocks partials=numerator}' | sed 's/k3s.store_partials %%max_1, %%sum_1, %%acc_1/k3s.store_partials %%acc_1, %%sum_1, %%max_1/' | not k3c opt - 2>&1 | filecheck %s --check-prefix=STORE
// RUN: k3c opt %s -p 'derive-block-attnres{partials-schedule=query-blocks partials=numerator}' | sed 's/%%acc_1, %%block_max, %%block_normaliser/%%acc_1, %%block_numerator, %%block_normaliser/' | not k3c opt - 2>&1 | filecheck %s --check-prefix=RANK
// RUN: k3c opt %s -p 'derive-block-attnres{partials-schedule=query-blocks partials=numerator}' | sed 's/%%block_numerator : !k3s.tile<>, !k3s.tile<>, !k3s.tile<D>/%%block_numerator : !k3s.tile<>, !k3s.tile<>, !k3s.tile<>/' | not k3c opt - 2>&1 | filecheck %s --check-prefix=LOAD
// RUN: k3c opt %s -p 'derive-block-attnres{partials-schedule=query-blocks}' | sed 's/%%acc_1, %%block_lse, %%block_mix/%%acc_1, %%block_mix, %%block_lse/' | not k3c opt - 2>&1 | filecheck %s --check-prefix=NRANK
// RUN: k3c opt %s -p 'derive-block-attnres{partials-schedule=query-blocks}' | sed 's/%%block_mix : !k3s.tile<>, !k3s.tile<>, !k3s.tile<D>/%%block_mix : !k3s.tile<D>, !k3s.tile<>, !k3s.tile<D>/' | not k3c opt - 2>&1 | filecheck %s --check-prefix=NLOAD
// RUN: k3c opt %s -p 'derive-block-attnres{partials-schedule=query-blocks}' | sed 's/queries = 32> : !k3s.tile<Q x D>/queries = 32> : !k3s.tile<D>/' | not k3c opt - 2>&1 | filecheck %s --check-prefix=FOLD
// RUN: k3c opt %s -p 'derive-block-attnres{partials-schedule=query-blocks}' | sed 's/queries = 32>/queries = 24>/' | not k3c opt - 2>&1 | filecheck %s --check-prefix=FOLD24
// The shown IR of the example spec.
// RUN: k3c ir %examples/attnres.toml -p 'derive-block-attnres{partials-schedule=query-blocks}' | filecheck %s --check-prefix=K3

builtin.module {
  k3.attnres @ar <hidden_size = 96, num_blocks = 6, block_size = 4, eps = 0.0001, dtype = bfloat16>
  k3.attnres @wide <hidden_size = 9000, num_blocks = 2, block_size = 4, eps = 0.001, dtype = float32>
}

// CHECK:      builtin.module {
// CHECK-NEXT:   k3.attnres @ar <hidden_size = 96, num_blocks = 6, block_size = 4, eps = 0.0001, dtype = bfloat16>
// CHECK-NEXT:   k3s.entry @ar_block_partials <source = @ar, max_sources = 6> {
// CHECK-NEXT:     %representatives = k3s.tensor_arg @representatives <role = input> : !k3s.tensor<S x B x T x 96, float>
// CHECK-NEXT:     %queries = k3s.tensor_arg @queries <role = input> : !k3s.tensor<Q x 96, float>
// CHECK-NEXT:     %gains = k3s.tensor_arg @gains <role = input> : !k3s.tensor<Q x 96, float>
// CHECK-NEXT:     %block_lse = k3s.tensor_arg @block_lse <role = output> : !k3s.tensor<Q x B x T, float32>
// CHECK-NEXT:     %block_mix = k3s.tensor_arg @block_mix <role = output> : !k3s.tensor<Q x B x T x 96, float>
// CHECK-NEXT:     k3s.kernel @ar_block_partials <grid = [row_query_block], num_warps = 4, num_stages = 3> {
// CHECK-NEXT:       %q = k3s.fold_query %queries, %gains <hidden_size = 96, queries = 32> : !k3s.tile<Q x D>
// CHECK-NEXT:       %max, %sum, %acc = k3s.softmax_start : !k3s.tile<Q>, !k3s.tile<Q>, !k3s.tile<Q x D>
// CHECK-NEXT:       %max_1, %sum_1, %acc_1 = k3s.source_loop %max, %sum, %acc {
// CHECK-NEXT:       ^bb0(%max_2: !k3s.tile<Q>, %sum_2: !k3s.tile<Q>, %acc_2: !k3s.tile<Q x D>):
// CHECK-NEXT:         %x = k3s.load_source %representatives : !k3s.tile<D>
// CHECK-NEXT:         %score = k3s.rms_score %x, %q <eps = 0.0001> : !k3s.tile<Q>
// CHECK-NEXT:         %max_3, %sum_3, %p, %rescale = k3s.online_softmax %max_2, %sum_2, %score : !k3s.tile<Q>, !k3s.tile<Q>, !k3s.tile<Q>, !k3s.tile<Q>
// CHECK-NEXT:         %acc_3 = k3s.mix_accumulate %acc_2, %rescale, %p, %x : !k3s.tile<Q x D>
// CHECK-NEXT:         k3s.next_source %max_3, %sum_3, %acc_3
// CHECK-NEXT:       } : !k3s.tile<Q>, !k3s.tile<Q>, !k3s.tile<Q x D>
// CHECK-NEXT:       k3s.store_normalised_partials %max_1, %sum_1, %acc_1, %block_lse, %block_mix
// CHECK-NEXT:     }
// CHECK-NEXT:   }
// CHECK-NEXT:   k3s.entry @ar_block_merge <source = @ar, max_sources = 1> {
// CHECK-NEXT:     %partial_sum = k3s.tensor_arg @partial_sum <role = input> : !k3s.tensor<S x B x T x 96, float>
// CHECK-NEXT:     %query = k3s.tensor_arg @query <role = input> : !k3s.tensor<96, float>
// CHECK-NEXT:     %gain = k3s.tensor_arg @gain <role = input> : !k3s.tensor<96, float>
// CHECK-NEXT:     %block_lse = k3s.tensor_arg @block_lse <role = input> : !k3s.tensor<B x T, float32>
// CHECK-NEXT:     %block_mix = k3s.tensor_arg @block_mix <role = input> : !k3s.tensor<B x T x 96, float>
// CHECK-NEXT:     %out = k3s.tensor_arg @out <role = output> : !k3s.tensor<B x T x 96, float>
// CHECK-NEXT:     %lse = k3s.tensor_arg @lse <role = optional_output> : !k3s.tensor<B x T, float32>
// CHECK-NEXT:     k3s.kernel @ar_block_merge <grid = [row], num_warps = 4> {
// CHECK-NEXT:       %q = k3s.fold_query %query, %gain <hidden_size = 96> : !k3s.tile<D>
// CHECK-NEXT:       %max, %sum, %acc = k3s.load_normalised_partials %block_lse, %block_mix : !k3s.tile<>, !k3s.tile<>, !k3s.tile<D>
// CHECK-NEXT:       %max_1, %sum_1, %acc_1 = k3s.source_loop %max, %sum, %acc {
// CHECK-NEXT:       ^bb0(%max_2: !k3s.tile<>, %sum_2: !k3s.tile<>, %acc_2: !k3s.tile<D>):
// CHECK-NEXT:         %x = k3s.load_source %partial_sum : !k3s.tile<D>
// CHECK-NEXT:         %score = k3s.rms_score %x, %q <eps = 0.0001> : !k3s.tile<>
// CHECK-NEXT:         %max_3, %sum_3, %p, %rescale = k3s.online_softmax %max_2, %sum_2, %score : !k3s.tile<>, !k3s.tile<>, !k3s.tile<>, !k3s.tile<>
// CHECK-NEXT:         %acc_3 = k3s.mix_accumulate %acc_2, %rescale, %p, %x : !k3s.tile<D>
// CHECK-NEXT:         k3s.next_source %max_3, %sum_3, %acc_3
// CHECK-NEXT:       } : !k3s.tile<>, !k3s.tile<>, !k3s.tile<D>
// CHECK-NEXT:       k3s.normalize_store %acc_1, %sum_1, %out
// CHECK-NEXT:       k3s.store_lse %max_1, %sum_1, %lse
// CHECK-NEXT:     }
// CHECK-NEXT:   }
// CHECK-NEXT:   k3.attnres @wide

// ORDER:      k3.attnres @ar
// ORDER-NEXT: k3s.entry @ar_aggregate <source = @ar, max_sources = 7> {
// ORDER:      k3s.entry @ar_aggregate_backward <source = @ar, max_sources = 7> {
// ORDER:      k3s.entry @ar_block_partials <source = @ar, max_sources = 6> {
// ORDER:      k3s.entry @ar_block_merge <source = @ar, max_sources = 1> {
// ORDER-NOT:  k3s.entry @ar_
// ORDER:      k3.attnres @wide

// OPTS:       k3s.kernel @ar_block_partials <grid = [row_query_block], num_warps = 4, num_stages = 3> {
// OPTS-NEXT:    %q = k3s.fold_query %queries, %gains <hidden_size = 96, queries = 2> : !k3s.tile<Q x D>

// WIDE:       k3s.kernel @wide_block_partials <grid = [row_query_block], num_warps = 16, num_stages = 3> {
// WIDE-NEXT:    %q = k3s.fold_query %queries, %gains <hidden_size = 9000, queries = 1> : !k3s.tile<Q x D>
// a row of 9000 columns takes 8 warps in the aggregate (2048 columns a warp): the merge is its kernel
// WIDE:       k3s.kernel @wide_block_merge <grid = [row], num_warps = 8> {

// POW2: {{^}}k3c opt: error: pipeline 'derive-block-attnres{queries-per-program=3}': derive-block-attnres: queries-per-program must be a power of two, got 3{{$}}

// NUMERATOR:      %block_max = k3s.tensor_arg @block_max <role = output> : !k3s.tensor<Q x B x T, float32>
// NUMERATOR-NEXT: %block_normaliser = k3s.tensor_arg @block_normaliser <role = output> : !k3s.tensor<Q x B x T, float32>
// NUMERATOR-NEXT: %block_numerator = k3s.tensor_arg @block_numerator <role = output> : !k3s.tensor<Q x B x T x 96, float32>
// NUMERATOR:      k3s.store_partials %max_1, %sum_1, %acc_1, %block_max, %block_normaliser, %block_numerator
// NUMERATOR:      %block_max = k3s.tensor_arg @block_max <role = input> : !k3s.tensor<B x T, float32>
// NUMERATOR-NEXT: %block_normaliser = k3s.tensor_arg @block_normaliser <role = input> : !k3s.tensor<B x T, float32>
// NUMERATOR-NEXT: %block_numerator = k3s.tensor_arg @block_numerator <role = input> : !k3s.tensor<B x T x 96, float32>
// NUMERATOR:      %max, %sum, %acc = k3s.load_partials %block_max, %block_normaliser, %block_numerator : !k3s.tile<>, !k3s.tile<>, !k3s.tile<D>

// GROUPS:          k3s.kernel @ar_block_partials <grid = [row_query_block], num_warps = 4, num_stages = 3, max_rows = 2047> {
// GROUPS:          k3s.kernel @ar_block_partials_groups <grid = [row_group_query_block], num_warps = 4, num_stages = 4, min_rows = 2048> {
// GROUPS-NEXT:       %q = k3s.fold_query %queries, %gains <hidden_size = 96, queries = 32> : !k3s.tile<Q x D>
// GROUPS-NEXT:       %max, %sum, %acc = k3s.softmax_start : !k3s.tile<Q>, !k3s.tile<Q>, !k3s.tile<Q x D>
// GROUPS-NEXT:       %max_1, %sum_1, %acc_1 = k3s.row_source_loop %max, %sum, %acc <rows = 8> {
// GROUPS-NEXT:       ^bb0(%max_2: !k3s.tile<Q>, %sum_2: !k3s.tile<Q>, %acc_2: !k3s.tile<Q x D>):
// GROUPS-NEXT:         %max_3 = k3s.row_start %max_2 : !k3s.tile<Q>
// GROUPS-NEXT:         %x = k3s.load_source %representatives : !k3s.tile<D>
// GROUPS-NEXT:         %score = k3s.rms_score %x, %q <eps = 0.0001> : !k3s.tile<Q>
// GROUPS-NEXT:         %max_4, %sum_3, %p, %rescale = k3s.online_softmax %max_3, %sum_2, %score : !k3s.tile<Q>, !k3s.tile<Q>, !k3s.tile<Q>, !k3s.tile<Q>
// GROUPS-NEXT:         %acc_3 = k3s.mix_accumulate %acc_2, %rescale, %p, %x : !k3s.tile<Q x D>
// GROUPS-NEXT:         k3s.at_row_end {
// GROUPS-NEXT:           k3s.store_normalised_partials %max_4, %sum_3, %acc_3, %block_lse, %block_mix
// GROUPS-NEXT:         }
// GROUPS-NEXT:         k3s.next_source %max_4, %sum_3, %acc_3
// GROUPS-NEXT:       } : !k3s.tile<Q>, !k3s.tile<Q>, !k3s.tile<Q x D>
// GROUPS-NEXT:     }
// GROUPS:          k3s.kernel @ar_block_merge <grid = [row], num_warps = 4, max_rows = 2047> {
// GROUPS:          k3s.kernel @ar_block_merge_groups <grid = [row_group], num_warps = 4, num_stages = 4, min_rows = 2048> {
// GROUPS:            %max_1, %sum_1, %acc_1 = k3s.row_source_loop %max, %sum, %acc <rows = 8> {
// GROUPS-NEXT:       ^bb0(%max_2: !k3s.tile<>, %sum_2: !k3s.tile<>, %acc_2: !k3s.tile<D>):
// GROUPS-NEXT:         %row_max, %row_sum, %row_acc = k3s.load_normalised_partials %block_lse, %block_mix : !k3s.tile<>, !k3s.tile<>, !k3s.tile<D>
// GROUPS-NEXT:         %max_3, %sum_3, %acc_3 = k3s.row_resume %max_2, %sum_2, %acc_2, %row_max, %row_sum, %row_acc : !k3s.tile<>, !k3s.tile<>, !k3s.tile<D>
// GROUPS-NEXT:         %x = k3s.load_source %partial_sum : !k3s.tile<D>
// GROUPS-NEXT:         %score = k3s.rms_score %x, %q <eps = 0.0001> : !k3s.tile<>
// GROUPS-NEXT:         %max_4, %sum_4, %p, %rescale = k3s.online_softmax %max_3, %sum_3, %score : !k3s.tile<>, !k3s.tile<>, !k3s.tile<>, !k3s.tile<>
// GROUPS-NEXT:         %acc_4 = k3s.mix_accumulate %acc_3, %rescale, %p, %x : !k3s.tile<D>
// GROUPS-NEXT:         k3s.at_row_end {
// GROUPS-NEXT:           k3s.normalize_store %acc_4, %sum_4, %out
// GROUPS-NEXT:           k3s.store_lse %max_4, %sum_4, %lse
// GROUPS-NEXT:         }
// SPLIT: {{^}}k3c opt: error: pipeline 'derive-block-attnres{grouped-from-rows=-1}': derive-block-attnres: grouped-from-rows must be >= 0 (0: always grouped), got -1{{$}}
// ROWS0: {{^}}k3c opt: error: pipeline 'derive-block-attnres{rows-per-program=0}': derive-block-attnres: rows-per-program must be >= 1, got 0{{$}}

// PARTIALS: {{^}}k3c opt: error: pipeline 'derive-block-attnres{partials=fp32}': derive-block-attnres: partials must be one of normalised, numerator, got fp32{{$}}

// STORE: k3s.store_partials: the running max must be <Q>, got <Q x D>
// RANK: k3s.store_partials: block_max must have 3 dimensions, got 4 (Q,B,T,96)
// LOAD: k3s.load_partials: the mix must be <D>, got <>
// NRANK: k3s.store_normalised_partials: block_lse must have 3 dimensions, got 4 (Q,B,T,96)
// NLOAD: k3s.load_normalised_partials: the running max must be <>, got <D>
// FOLD: k3s.fold_query: the folded query must be <Q x D>, got <D>
// FOLD24: k3s.fold_query: queries must be a power of two, got 24

// K3:      k3.attnres @attnres <hidden_size = 7168, num_blocks = 8, block_size = 12, eps = 1.0e-06, dtype = bfloat16>
// K3-NEXT: k3s.entry @block_partials <source = @attnres, max_sources = 8> {
// K3:        k3s.kernel @attnres_block_partials <grid = [row_query_block], num_warps = 16, num_stages = 3> {
// K3-NEXT:     %q = k3s.fold_query %queries, %gains <hidden_size = 7168, queries = 2> : !k3s.tile<Q x D>
// K3:      k3s.entry @block_merge <source = @attnres, max_sources = 1> {
// K3:        k3s.kernel @attnres_block_merge <grid = [row], num_warps = 4> {

// COLUMNS:      k3s.entry @ar_block_partials <source = @ar, max_sources = 6> {
// COLUMNS:        %folded = k3s.tensor_arg @folded <role = workspace> : !k3s.tensor<2 x Q x 96, float>
// COLUMNS-NEXT:   k3s.kernel @ar_block_partials_fold <grid = [input_block], num_warps = 4, block_d = 128> {
// COLUMNS-NEXT:     k3s.fold_queries_split %queries, %gains, %folded <hidden_size = 96, columns = 128>
// COLUMNS:        k3s.kernel @ar_block_partials_columns <grid = [row_group_all_queries]
// COLUMNS-NEXT:     %gram = k3s.zeros : !k3s.tile<R x S x R x S>
// COLUMNS-NEXT:     %qx = k3s.zeros : !k3s.tile<Q x R x S>
// COLUMNS-NEXT:     %gram_1, %qx_1 = k3s.column_loop %gram, %qx <columns = 128> {
// COLUMNS:            %x = k3s.load_group_sources %representatives <hidden_size = 96, rows = 4, sources = 6> : !k3s.tile<R x S x D>
// COLUMNS-NEXT:       %q_high, %q_low = k3s.load_folded_queries %folded
// COLUMNS-NEXT:       %gram_3, %qx_3 = k3s.group_column_dots %x, %q_high, %q_low, %gram_2, %qx_2
// COLUMNS-NEXT:       k3s.next_column %gram_3, %qx_3
// COLUMNS:          %score = k3s.group_scores %gram_1, %qx_1, %representatives, %folded <eps = 0.0001> : !k3s.tile<R x S x Q>
// COLUMNS-NEXT:     %max, %sum, %p = k3s.group_softmax %score <normalised = true>
// COLUMNS-NEXT:     k3s.store_group_stats %max, %sum, %block_lse
// COLUMNS-NEXT:     %p_high, %p_low = k3s.split_weights %p, %representatives
// COLUMNS-NEXT:     k3s.column_loop <columns = 128, reverse = true> {
// COLUMNS-NEXT:       %x_1 = k3s.load_group_sources %representatives <hidden_size = 96, rows = 4, sources = 6, last_use = true>
// COLUMNS-NEXT:       %mix = k3s.group_mix %x_1, %p_high, %p_low : !k3s.tile<R x Q x D>
// COLUMNS-NEXT:       k3s.store_group_rows %mix, %block_mix
// COLUMNS:        k3s.entry @ar_block_merge
