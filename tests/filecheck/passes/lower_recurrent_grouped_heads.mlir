// lower-recurrent with grouped value heads (num_v_heads = 3 x num_heads, GVA): q and k keep
// num_heads = 2; v, g, beta, o and the states use num_v_heads = 6. K = 64 != V = 32 so the
// key and value dims cannot be confused either.
// RUN: k3c opt %s -p lower-recurrent | filecheck %s
// RUN: k3c opt %s -p lower-recurrent | k3c opt - | filecheck %s

builtin.module {
  k3.recurrence @gva <gate = channel, delta_rule = true, num_heads = 2, num_v_heads = 6, head_k_dim = 64, head_v_dim = 32, scale = 0.125, state_layout = kv, dtype = bfloat16>
}

// CHECK:      k3s.entry @recurrent <source = @gva> {
// CHECK-NEXT:   %q = k3s.tensor_arg @q <role = input> : !k3s.tensor<B x T x 2 x 64, float>
// CHECK-NEXT:   %k = k3s.tensor_arg @k <role = input> : !k3s.tensor<B x T x 2 x 64, float>
// CHECK-NEXT:   %v = k3s.tensor_arg @v <role = input> : !k3s.tensor<B x T x 6 x 32, float>
// CHECK-NEXT:   %g = k3s.tensor_arg @g <role = input> : !k3s.tensor<B x T x 6 x 64, float>
// CHECK-NEXT:   %beta = k3s.tensor_arg @beta <role = input> : !k3s.tensor<B x T x 6, float>
// CHECK-NEXT:   %scale = k3s.scalar_arg @scale <default = 0.125> : f32
// CHECK-NEXT:   %initial_state = k3s.tensor_arg @initial_state <role = optional_input> : !k3s.tensor<N x 6 x 64 x 32, float32>
// CHECK-NEXT:   %o = k3s.tensor_arg @o <role = output> : !k3s.tensor<B x T x 6 x 32, float>
// CHECK-NEXT:   %final_state = k3s.tensor_arg @final_state <role = optional_output> : !k3s.tensor<N x 6 x 64 x 32, float32>
// CHECK:        k3s.state_tile %initial_state <head_k_dim = 64, head_v_dim = 32, block_v = 32, layout = kv>
