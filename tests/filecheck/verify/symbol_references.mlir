// The properties that refer to other ops of the module are symbol references (`@name`), looked
// up in the module's symbol table when it verifies: a launch's kernel and a kernel's
// shares_code_of name a k3s.kernel, an entry's source a k3 op, an entry_by_rows' entries and
// by_rows (lists of them). A misspelt or misdirected reference is a one-line error naming the op
// and the symbol.
// The file as written is valid and prints back unchanged; each sed variant breaks one reference.
// RUN: k3c opt %s | filecheck %s --check-prefix=OK
// RUN: k3c opt %s --generic | k3c opt - | filecheck %s --check-prefix=OK
// RUN: sed 's/k3s.launch @prepare_twin /k3s.launch @prepare_twn /' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=LAUNCH
// RUN: sed 's/k3s.launch @prepare_twin /k3s.launch @layer /' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=LAUNCHKIND
// RUN: sed 's/shares_code_of = @prepare>/shares_code_of = @prepar>/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=SHARES
// RUN: sed 's/k3s.entry @summary <source = @layer>/k3s.entry @summary <source = @layr>/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=SOURCE
// RUN: sed 's/k3s.entry @summary <source = @layer>/k3s.entry @summary <source = @prepare>/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=SOURCEKIND
// RUN: sed 's/entries = \[@summary,/entries = [@sumary,/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=SMALL
// RUN: sed 's/by_rows = \[@summary, @chunk\]/by_rows = [@summary, @prepare_twin]/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=LARGE
// RUN: sed 's/kernel = @prepare_twin, max_rows/kernel = @prepare, max_rows/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=BYROWS

builtin.module {
  k3.recurrence @layer <gate = channel, delta_rule = true, num_heads = 2, num_v_heads = 2, head_k_dim = 8, head_v_dim = 4, scale = 0.25, state_layout = kv, dtype = float32>
  k3s.kernel @prepare <grid = [chunk, value_head], num_warps = 4> {
  ^bb0(%k: !k3s.tensor<B x T x 2 x 8, float>, %W: !k3s.tensor<B x T x 4 x 8, float>):
    k3s.chunk_tile <chunk_size = 16, head_k_dim = 8, head_v_dim = 4>
    %k_1 = k3s.load_chunk %k : !k3s.tile<C x K>
    %A = k3s.gram %k_1, %k_1 <mask = strict, gate = none, beta = false> : !k3s.tile<C x C>
    k3s.spill %W, %A
  }
  k3s.entry @summary <source = @layer> {
    %k = k3s.tensor_arg @k <role = input> : !k3s.tensor<B x T x 2 x 8, float>
    %W = k3s.tensor_arg @W <role = workspace> : !k3s.tensor<B x T x 4 x 8, float>
    k3s.launch @prepare %k, %W
  }
  k3s.kernel @prepare_twin <grid = [chunk, value_head], num_warps = 8, shares_code_of = @prepare> {
  ^bb0(%k: !k3s.tensor<B x T x 2 x 8, float>, %W: !k3s.tensor<B x T x 4 x 8, float>):
    k3s.chunk_tile <chunk_size = 16, head_k_dim = 8, head_v_dim = 4>
    %k_1 = k3s.load_chunk %k : !k3s.tile<C x K>
    %A = k3s.gram %k_1, %k_1 <mask = strict, gate = none, beta = false> : !k3s.tile<C x C>
    k3s.spill %W, %A
  }
  k3s.entry @chunk <source = @layer> {
    %k = k3s.tensor_arg @k <role = input> : !k3s.tensor<B x T x 2 x 8, float>
    %W = k3s.tensor_arg @W <role = workspace> : !k3s.tensor<B x T x 4 x 8, float>
    k3s.launch @prepare_twin %k, %W
    k3s.launch_by_rows <kernel = @prepare_twin, max_rows = 64, num_warps = 4>
  }
  k3s.entry_by_rows @by_rows <source = @layer, entries = [@summary, @chunk], words = [few, many], max_rows = [64], by_rows = [@summary, @chunk]>
}

// OK:      k3s.kernel @prepare_twin <grid = [chunk, value_head], num_warps = 8, shares_code_of = @prepare> {
// OK:        k3s.launch @prepare_twin %k, %W
// OK-NEXT:   k3s.launch_by_rows <kernel = @prepare_twin, max_rows = 64, num_warps = 4>
// OK:      k3s.entry_by_rows @by_rows <source = @layer, entries = [@summary, @chunk], words = [few, many], max_rows = [64], by_rows = [@summary, @chunk]>

// LAUNCH-NOT: {{\n}}
// LAUNCH: {{^}}k3c opt: error: <stdin>: k3s.launch: kernel = @prepare_twn: the module has no symbol @prepare_twn{{$}}
// LAUNCH-NOT: {{.}}

// LAUNCHKIND-NOT: {{\n}}
// LAUNCHKIND: {{^}}k3c opt: error: <stdin>: k3s.launch: kernel = @layer is a k3.recurrence, not a k3s.kernel{{$}}
// LAUNCHKIND-NOT: {{.}}

// SHARES-NOT: {{\n}}
// SHARES: {{^}}k3c opt: error: <stdin>: k3s.kernel @prepare_twin: shares_code_of = @prepar: the module has no symbol @prepar{{$}}
// SHARES-NOT: {{.}}

// SOURCE-NOT: {{\n}}
// SOURCE: {{^}}k3c opt: error: <stdin>: k3s.entry @summary: source = @layr: the module has no symbol @layr{{$}}
// SOURCE-NOT: {{.}}

// SOURCEKIND-NOT: {{\n}}
// SOURCEKIND: {{^}}k3c opt: error: <stdin>: k3s.entry @summary: source = @prepare is a k3s.kernel, not a k3 op{{$}}
// SOURCEKIND-NOT: {{.}}

// SMALL-NOT: {{\n}}
// SMALL: {{^}}k3c opt: error: <stdin>: k3s.entry_by_rows @by_rows: entries = @sumary: the module has no symbol @sumary{{$}}
// SMALL-NOT: {{.}}

// LARGE-NOT: {{\n}}
// LARGE: {{^}}k3c opt: error: <stdin>: k3s.entry_by_rows @by_rows: by_rows = @prepare_twin is a k3s.kernel, not a k3s.entry{{$}}
// LARGE-NOT: {{.}}

// BYROWS-NOT: {{\n}}
// BYROWS: {{^}}k3c opt: error: <stdin>: k3s.launch_by_rows <kernel = @prepare, max_rows = 64>: no kernel @prepare launched before it in its entry{{$}}
// BYROWS-NOT: {{.}}
