// k3s stage ops only live inside their parent region: a decay at the top level of the module
// (its operands from a cast) is rejected, naming the op and the parent it needs. The sed
// variants move other stages out of place (a token stage directly in a kernel, a kernel stage
// inside the token loop, an AttnRes stage in a token loop (its operands from a cast), an
// argument outside any entry).
// RUN: not k3c opt %s 2>&1 | filecheck %s --check-prefix=ERR
// RUN: sed 's/^  %%S_1 = k3s.decay %%state, %%gate <gate = channel> : !k3s.tile<K x V>$/  k3s.entry @e <source = @x> { %%q = k3s.tensor_arg @q <role = input> : !k3s.tensor<B x T, float> k3s.kernel @k <grid = [row], num_warps = 4> { %%q_1 = k3s.load_token %%q : !k3s.tile<K> } }/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=LOAD
// RUN: sed 's/^  %%S_1 = k3s.decay %%state, %%gate <gate = channel> : !k3s.tile<K x V>$/  k3s.entry @e <source = @x> { k3s.kernel @k <grid = [row], num_warps = 4> { %%S0 = builtin.unrealized_conversion_cast to !k3s.tile<K x V> %%S_final = k3s.token_loop %%S0 { ^bb0(%%S: !k3s.tile<K x V>): %%S_1 = k3s.state_tile <head_k_dim = 4, head_v_dim = 4, block_v = 4, layout = kv, start = zero> : !k3s.tile<K x V> k3s.next_token %%S } : !k3s.tile<K x V> } }/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=TILE
// RUN: sed 's/^  %%S_1 = k3s.decay %%state, %%gate <gate = channel> : !k3s.tile<K x V>$/  k3s.entry @e <source = @x> { k3s.kernel @k <grid = [row], num_warps = 4> { %%S0 = builtin.unrealized_conversion_cast to !k3s.tile<K x V> %%S_final = k3s.token_loop %%S0 { ^bb0(%%S: !k3s.tile<K x V>): %%x, %%q = builtin.unrealized_conversion_cast to !k3s.tile<D>, !k3s.tile<D> %%score = k3s.rms_score %%x, %%q <eps = 0.1> : !k3s.tile<> k3s.next_token %%S } : !k3s.tile<K x V> } }/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=SCORE
// RUN: sed 's/^  %%S_1 = k3s.decay %%state, %%gate <gate = channel> : !k3s.tile<K x V>$/  %q = k3s.tensor_arg @q <role = input> : !k3s.tensor<B x T, float>/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=ARG

builtin.module {
  %state, %gate = builtin.unrealized_conversion_cast to !k3s.tile<K x V>, !k3s.tile<K>
  %S_1 = k3s.decay %state, %gate <gate = channel> : !k3s.tile<K x V>
}

// ERR-NOT: {{\n}}
// ERR: {{^}}k3c opt: error: {{.*}}stage_outside_parent.mlir: 'k3s.decay' expects parent op 'k3s.token_loop'{{$}}
// ERR-NOT: {{.}}

// LOAD-NOT: {{\n}}
// LOAD: {{^}}k3c opt: error: <stdin>: 'k3s.load_token' expects parent op 'k3s.token_loop'{{$}}
// LOAD-NOT: {{.}}

// TILE-NOT: {{\n}}
// TILE: {{^}}k3c opt: error: <stdin>: 'k3s.state_tile' expects parent op 'k3s.kernel'{{$}}
// TILE-NOT: {{.}}

// SCORE-NOT: {{\n}}
// SCORE: {{^}}k3c opt: error: <stdin>: 'k3s.rms_score' expects parent op to be one of 'k3s.source_loop', 'k3s.row_source_loop'{{$}}
// SCORE-NOT: {{.}}

// ARG-NOT: {{\n}}
// ARG: {{^}}k3c opt: error: <stdin>: 'k3s.tensor_arg' expects parent op 'k3s.entry'{{$}}
// ARG-NOT: {{.}}
