// lower-recurrent with a vk state layout (serving stacks): the state tensors are [N, HV, V, K]
// and the on-chip tile and the final store use layout vk. K = 64 != V = 32.
// RUN: k3c opt %s -p lower-recurrent | filecheck %s
// RUN: k3c opt %s -p lower-recurrent | k3c opt - | filecheck %s

builtin.module {
  k3.recurrence @kda_vk <gate = channel, delta_rule = true, num_heads = 4, num_v_heads = 4, head_k_dim = 64, head_v_dim = 32, scale = 0.125, state_layout = vk, dtype = bfloat16>
}

// CHECK:      k3s.entry @recurrent <source = @kda_vk> {
// CHECK:        %initial_state = k3s.tensor_arg @initial_state <role = optional_input> : !k3s.tensor<N x 4 x 32 x 64, float32>
// CHECK:        %final_state = k3s.tensor_arg @final_state <role = optional_output> : !k3s.tensor<N x 4 x 32 x 64, float32>
// CHECK:        k3s.kernel @kda_vk_recurrent
// CHECK-NEXT:     %S = k3s.state_tile %initial_state <head_k_dim = 64, head_v_dim = 32, block_v = 32, layout = vk> : !k3s.tile<K x V>
// CHECK:          k3s.store_state %S_final, %final_state <layout = vk>
// CHECK-NOT:    layout = kv
