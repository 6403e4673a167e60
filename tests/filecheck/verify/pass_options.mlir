// Bad pass options are one-line errors naming the pass and the option as spelled: block-v must
// be a power of two, an option the pass does not have is named with the options it has, a value
// of the wrong type is reported, and an option given twice is refused (not the last one taken).
// RUN: not k3c opt %s -p 'lower-recurrent{block-v=48}' 2>&1 | filecheck %s --check-prefix=POW2
// RUN: not k3c opt %s -p 'lower-recurrent{block-v=0}' 2>&1 | filecheck %s --check-prefix=ZERO
// RUN: not k3c opt %s -p 'lower-recurrent{chunk-size=64}' 2>&1 | filecheck %s --check-prefix=UNKNOWN
// RUN: not k3c opt %s -p 'lower-recurrent{block-v=wide}' 2>&1 | filecheck %s --check-prefix=TYPE
// RUN: not k3c opt %s -p 'lower-recurrent{blok-v=64}' 2>&1 | filecheck %s --check-prefix=TYPO
// RUN: not k3c opt %s -p 'lower-recurrent{block-v=16 block-v=64}' 2>&1 | filecheck %s --check-prefix=TWICE
// RUN: sh -c 'k3c opt "$1" -p "lower-recurrent{block-v=16 block-v=64}" 2>/dev/null; test $? -eq 2' sh %s

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
// UNKNOWN: {{^}}k3c opt: error: pipeline 'lower-recurrent{chunk-size=64}': lower-recurrent has no option 'chunk-size' (its options: block-v, num-warps, token-stages){{$}}
// UNKNOWN-NOT: {{.}}

// TYPE-NOT: {{\n}}
// TYPE: {{^}}k3c opt: error: pipeline 'lower-recurrent{block-v=wide}': lower-recurrent option 'block-v' expects an integer, got 'wide'{{$}}
// TYPE-NOT: {{.}}

// TYPO-NOT: {{\n}}
// TYPO: {{^}}k3c opt: error: pipeline 'lower-recurrent{blok-v=64}': lower-recurrent has no option 'blok-v' (its options: block-v, num-warps, token-stages){{$}}
// TYPO-NOT: {{.}}

// TWICE-NOT: {{\n}}
// TWICE: {{^}}k3c opt: error: pipeline 'lower-recurrent{block-v=16 block-v=64}': lower-recurrent option 'block-v' is given twice; give it once{{$}}
// TWICE-NOT: {{.}}
