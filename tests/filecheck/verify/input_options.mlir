// What a k3.recurrence's inputs mean must fit the member: an in-kernel gate (softplus, bounded)
// needs a gate, beta as logits needs the delta rule (beta), the bounded gate's lower bound is
// negative, and gate_input / beta_input take their listed values. Each error is one line naming
// the op and the property.
// RUN: k3c opt %s | filecheck %s --check-prefix=VALID
// RUN: sed 's/gate = channel/gate = none/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=NOGATE
// RUN: sed 's/gate = channel/gate = none/; s/gate_input = softplus/gate_input = bounded/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=NOGATEB
// RUN: sed 's/delta_rule = true/delta_rule = false/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=NOBETA
// RUN: sed 's/gate_lower_bound = -3.0/gate_lower_bound = 0.0/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=BOUND0
// RUN: sed 's/gate_lower_bound = -3.0/gate_lower_bound = 2.5/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=BOUNDPOS
// RUN: sed 's/gate_input = softplus/gate_input = exp/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=GATEVALUE
// RUN: sed 's/beta_input = logits/beta_input = sigmoid/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=BETAVALUE
// RUN: sed 's/qk_l2norm = true/qk_l2norm = 1/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=L2BOOL
// The defaults are always valid: a gate-less member with a log gate input, GLA with beta as a
// probability.
// RUN: sed 's/gate = channel/gate = none/; s/gate_input = softplus, gate_lower_bound = -3.0/gate_input = log/' %s | k3c opt - | filecheck %s --check-prefix=DELTANET
// RUN: sed 's/delta_rule = true/delta_rule = false/; s/, gate_lower_bound = -3.0//; s/beta_input = logits/beta_input = probability/' %s | k3c opt - | filecheck %s --check-prefix=GLA

builtin.module {
  k3.recurrence @r <gate = channel, delta_rule = true, num_heads = 2, num_v_heads = 2, head_k_dim = 16, head_v_dim = 16, scale = 0.25, state_layout = kv, dtype = float32, qk_l2norm = true, gate_input = softplus, gate_lower_bound = -3.0, beta_input = logits>
}

// VALID: k3.recurrence @r <gate = channel, delta_rule = true, {{.*}}, qk_l2norm = true, gate_input = softplus, gate_lower_bound = -3.0, beta_input = logits>

// NOGATE-NOT: {{\n}}
// NOGATE: {{^}}k3c opt: error: <stdin>: k3.recurrence @r: gate_input must be log without a gate, got 'softplus'{{$}}
// NOGATE-NOT: {{.}}

// NOGATEB-NOT: {{\n}}
// NOGATEB: {{^}}k3c opt: error: <stdin>: k3.recurrence @r: gate_input must be log without a gate, got 'bounded'{{$}}
// NOGATEB-NOT: {{.}}

// NOBETA-NOT: {{\n}}
// NOBETA: {{^}}k3c opt: error: <stdin>: k3.recurrence @r: beta_input must be probability without the delta rule (no beta){{$}}
// NOBETA-NOT: {{.}}

// BOUND0-NOT: {{\n}}
// BOUND0: {{^}}k3c opt: error: <stdin>: k3.recurrence @r: gate_lower_bound must be < 0, got 0.0{{$}}
// BOUND0-NOT: {{.}}

// BOUNDPOS-NOT: {{\n}}
// BOUNDPOS: {{^}}k3c opt: error: <stdin>: k3.recurrence @r: gate_lower_bound must be < 0, got 2.5{{$}}
// BOUNDPOS-NOT: {{.}}

// GATEVALUE-NOT: {{\n}}
// GATEVALUE: {{^}}k3c opt: error: <stdin>:{{[0-9]+}}:{{[0-9]+}}: k3.recurrence: property 'gate_input' must be one of log, clamped, softplus, bounded; got exp{{$}}
// GATEVALUE-NOT: {{.}}

// BETAVALUE-NOT: {{\n}}
// BETAVALUE: {{^}}k3c opt: error: <stdin>:{{[0-9]+}}:{{[0-9]+}}: k3.recurrence: property 'beta_input' must be one of probability, logits, logits_neg_eigval; got sigmoid{{$}}
// BETAVALUE-NOT: {{.}}

// L2BOOL-NOT: {{\n}}
// L2BOOL: {{^}}k3c opt: error: <stdin>:{{[0-9]+}}:{{[0-9]+}}: k3.recurrence: property 'qk_l2norm' expects true or false, got 1{{$}}
// L2BOOL-NOT: {{.}}

// DELTANET: k3.recurrence @r <gate = none, delta_rule = true, {{.*}}, qk_l2norm = true, gate_input = log, beta_input = logits>
// GLA: k3.recurrence @r <gate = channel, delta_rule = false, {{.*}}, qk_l2norm = true, gate_input = softplus, beta_input = probability>
