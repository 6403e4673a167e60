"""The vocabularies of the IR's string attributes, in one place (no xDSL import, so the spec
checker and the CLI can read them cheaply). Each tuple lists what a property may say."""

DTYPES = ("bfloat16", "float16", "float32")
STATE_LAYOUTS = ("kv", "vk")  # a head's state as [K, V] (fla) or [V, K] (serving stacks)
GATES = ("channel", "scalar", "none")
GLU_ACTIVATIONS = ("swiglu", "situ_glu")
# what g means: the log-decay as given; max(g, gate_lower_bound) (fla's safe_gate contract);
# -exp(A_log) softplus(g + dt_bias); gate_lower_bound sigmoid(exp(A_log) (g + dt_bias))
GATE_INPUTS = ("log", "clamped", "softplus", "bounded")
BOUNDED_GATE_INPUTS = ("clamped", "bounded")  # g >= gate_lower_bound by construction
# what beta means: beta as given; sigmoid(beta); 2 sigmoid(beta) (fla's allow_neg_eigval: beta in
# (0, 2), so I - beta k k^T may have a negative eigenvalue)
BETA_INPUTS = ("probability", "logits", "logits_neg_eigval")
