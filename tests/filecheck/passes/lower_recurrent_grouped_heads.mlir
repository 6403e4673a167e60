// lower-recurrent with grouped value heads (num_v_heads = 3 x num_heads, GVA): q and k keep
// num_heads = 2; v, g, beta, o and the states use num_v_heads = 6. K = 64 != V = 32 so the
// key and value dims cannot be confused either.
// RUN: k3c opt %s -p lower-recurrent | filecheck %s
// RUN: k3c opt %s -p lower-recurrent | k3c opt - | filecheck %s

builtin.module {
  k3.recurrence @gva <gate = channel, delta_rule = true, num_heads = 2, num_v_heads = 6, head_k_dim = 64, head_v_dim = 32, scale = 0.125, state_layout = kv, dtype = bfloat16>
}

// CHECK:      k3s.entry @recurrent <source = gva> {
// CHECK-NEXT:   k3s.tensor_arg @q <type = !k3s.tensor<B x T x 2 x 64, float>, role = input>
// CHECK-NEXT:   k3s.tensor_arg @k <type = !k3s.tensor<B x T x 2 x 64, float>, role = input>
// CHECK-NEXT:   k3s.tensor_arg @v <type = !k3s.tensor<B x T x 6 x 32, float>, role = input>
// CHECK-NEXT:   k3s.tensor_arg @g <type = !k3s.tensor<B x T x 6 x 64, float>, role = input>
// CHECK-NEXT:   k3s.tensor_arg @beta <type = !k3s.tensor<B x T x 6, float>, role = input>
// CHECK-NEXT:   k3s.scalar_arg @scale <default = 0.125>
// CHECK-NEXT:   k3s.tensor_arg @initial_state <type = !k3s.tensor<N x 6 x 64 x 32, float32>, role = optional_input>
// CHECK-NEXT:   k3s.tensor_arg @o <type = !k3s.tensor<B x T x 6 x 32, float>, role = output>
// CHECK-NEXT:   k3s.tensor_arg @final_state <type = !k3s.tensor<N x 6 x 64 x 32, float32>, role = optional_output>
// CHECK:        k3s.state_tile <head_k_dim = 64, head_v_dim = 32, block_v = 32, layout = kv>
