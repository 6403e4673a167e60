// An unknown pass name is a one-line error naming it and listing the passes that exist.
// RUN: not k3c opt %s -p lower-chunky 2>&1 | filecheck %s --check-prefix=ERR
// ... also when it follows a valid pass (nothing is printed: the pipeline is parsed first).
// RUN: not k3c opt %s -p lower-recurrent,fuse-attnres,no-such-pass 2>&1 | filecheck %s --check-prefix=LATER

builtin.module {
  k3.recurrence @r <gate = channel, delta_rule = true, num_heads = 4, num_v_heads = 4, head_k_dim = 64, head_v_dim = 64, scale = 0.125, state_layout = kv, dtype = float32>
}

// ERR-NOT: {{\n}}
// ERR: {{^}}k3c opt: error: pipeline 'lower-chunky': unknown pass 'lower-chunky'; passes: {{.*}}lower-recurrent{{.*}}{{$}}
// ERR-NOT: {{.}}

// LATER-NOT: {{\n}}
// LATER: {{^}}k3c opt: error: pipeline 'lower-recurrent,fuse-attnres,no-such-pass': unknown pass 'no-such-pass'; passes: {{.*}}fuse-attnres{{.*}}{{$}}
// LATER-NOT: {{.}}
