// A tensor argument's purpose (k3s.arg_purpose) is what the printer recognises it by, never its
// name: a misspelt purpose is a parse error, an offsets tensor without purpose = sequence_offsets
// and a purpose on a tensor of the wrong dtype class fail verify, each as one line; so does a
// distinct_from that names no other tensor argument of the entry.
// RUN: k3c opt %s | filecheck %s --check-prefix=VALID
// RUN: sed 's/purpose = state_slots/purpose = state_slot/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=MISSPELT
// RUN: sed 's/, purpose = sequence_offsets//' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=MISSING
// RUN: sed 's/<B, index>/<B, float>/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=DTYPE
// RUN: sed 's/<P x 4 x 2 x 24, float32>/<P, float32>/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=DEPTH
// RUN: sed 's/distinct_from = @cache/distinct_from = @cahce/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=DISTINCT

builtin.module {
  k3.recurrence @r <gate = none, delta_rule = true, num_heads = 2, num_v_heads = 2, head_k_dim = 8, head_v_dim = 4, scale = 0.25, state_layout = kv, dtype = float32>
  k3s.entry @step <source = @r> {
    %cu_seqlens = k3s.tensor_arg @cu_seqlens <role = optional_input, purpose = sequence_offsets> : !k3s.tensor<N+1, offsets>
    %state_indices = k3s.tensor_arg @state_indices <role = input, purpose = state_slots> : !k3s.tensor<B, index>
    %cache = k3s.tensor_arg @cache <role = workspace, purpose = draft_states> : !k3s.tensor<P x 4 x 2 x 24, float32>
    %next_cache = k3s.tensor_arg @next_cache <role = inout, purpose = draft_states, distinct_from = @cache> : !k3s.tensor<P x 4 x 2 x 24, float32>
  }
}

// VALID:      k3s.tensor_arg @cu_seqlens <role = optional_input, purpose = sequence_offsets> : !k3s.tensor<N+1, offsets>
// VALID-NEXT: k3s.tensor_arg @state_indices <role = input, purpose = state_slots> : !k3s.tensor<B, index>
// VALID-NEXT: k3s.tensor_arg @cache <role = workspace, purpose = draft_states> : !k3s.tensor<P x 4 x 2 x 24, float32>
// VALID-NEXT: k3s.tensor_arg @next_cache <role = inout, purpose = draft_states, distinct_from = @cache> : !k3s.tensor<P x 4 x 2 x 24, float32>

// MISSPELT-NOT: {{\n}}
// MISSPELT: {{^}}k3c opt: error: {{.*}}: k3s.tensor_arg: property 'purpose' must be one of {{.*}}; got state_slot{{$}}
// MISSPELT-NOT: {{.}}

// MISSING-NOT: {{\n}}
// MISSING: {{^}}k3c opt: error: {{.*}}: k3s.tensor_arg @cu_seqlens: an offsets tensor needs purpose = sequence_offsets{{$}}
// MISSING-NOT: {{.}}

// DTYPE-NOT: {{\n}}
// DTYPE: {{^}}k3c opt: error: {{.*}}: k3s.tensor_arg @state_indices: purpose = state_slots needs dtype class index, got float{{$}}
// DTYPE-NOT: {{.}}

// DEPTH-NOT: {{\n}}
// DEPTH: {{^}}k3c opt: error: {{.*}}: k3s.tensor_arg @cache: purpose = draft_states needs [P, depth, ...], got [P]{{$}}
// DEPTH-NOT: {{.}}

// DISTINCT-NOT: {{\n}}
// DISTINCT: {{^}}k3c opt: error: {{.*}}: k3s.tensor_arg @next_cache: distinct_from = @cahce: its entry has no other tensor argument @cahce{{$}}
// DISTINCT-NOT: {{.}}
