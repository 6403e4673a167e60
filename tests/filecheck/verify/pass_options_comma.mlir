// A malformed pipeline (here options separated by a comma instead of a space, an easy mistake)
// is a one-line error and exit status 2. xDSL 0.74 raises ArgSpecParseError, a BaseException
// whose first line is only "Error parsing pass pipeline specification:", so pipeline.py catches
// it by name and reports the column, xDSL's message and the right form.
// RUN: sh -c 'k3c opt "$1" -p "lower-recurrent{block-v=64,num-warps=8}" 2>/dev/null; test $? -eq 2' sh %s
// RUN: not k3c opt %s -p 'lower-recurrent{block-v=64,num-warps=8}' 2>&1 | filecheck %s --check-prefix=ERR

builtin.module {
  k3.recurrence @r <gate = channel, delta_rule = true, num_heads = 4, num_v_heads = 4, head_k_dim = 64, head_v_dim = 64, scale = 0.125, state_layout = kv, dtype = float32>
}

// ERR-NOT: {{\n}}
// ERR: {{^}}k3c opt: error: pipeline 'lower-recurrent{block-v=64,num-warps=8}': {{.+}}{{$}}
// ERR-NOT: {{.}}
