// Bad pass options are one-line errors: block-v must be a power of two, an option the pass
// does not have is named, and a value of the wrong type is reported.
// RUN: not k3c opt %s -p 'lower-recurrent{block-v=48}' 2>&1 | filecheck %s --check-prefix=POW2
// RUN: not k3c opt %s -p 'lower-recurrent{block-v=0}' 2>&1 | filecheck %s --check-prefix=ZERO
// RUN: not k3c opt %s -p 'lower-recurrent{chunk-size=64}' 2>&1 | filecheck %s --check-prefix=UNKNOWN
// RUN: not k3c opt %s -p 'lower-recurrent{block-v=wide}' 2>&1 | filecheck %s --check-prefix=TYPE

builtin.module {
  k3.recurrence @r <gate = channel, delta_rule = true, num_heads = 4, num_v_heads = 4, head_k_dim = 64, head_v_dim = 64, scale = 0.125, state_layout = kv, dtype = float32>
}

// POW2-NOT: {{\n}}
// POW2: {{^}}k3c opt: error: pipeline 'lower-recurrent{block-v=48}': lower-recurrent: block-v must be a power of two, got 48{{$}}
// POW2-NOT: {{.}}

// ZERO-NOT: {{\n}}
// ZERO: {{^}}k3c opt: error: pipeline 'lower-recurrent{block-v=0}': lower-recurrent: block-v must be a power of two, got 0{{$}}
// ZERO-NOT: {{.}}

// UNKNOWN-NOT: {{\n}}
// UNKNOWN: {{^}}k3c opt: error: pipeline 'lower-recurrent{chunk-size=64}': {{.*}}chunk_size{{.*}}{{$}}
// UNKNOWN-NOT: {{.}}

// TYPE-NOT: {{\n}}
// TYPE: {{^}}k3c opt: error: pipeline 'lower-recurrent{block-v=wide}': {{.*}}wide{{.*}}{{$}}
// TYPE-NOT: {{.}}
