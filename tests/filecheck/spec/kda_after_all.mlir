// Spec-driven: `k3c ir --after-all` on the KDA example prints the layer IR built from the spec
// (scale defaulted to head_k_dim ** -0.5, kind kda = channel gate + delta rule) and the IR after
// its default pipeline (lower-recurrent) with the derived stages.
// RUN: k3c ir %examples/kda.toml --after-all | filecheck %s
// A pipeline given with -p replaces the default one.
// RUN: k3c ir %examples/kda.toml --after-all -p 'lower-recurrent{block-v=64 num-warps=8}' | filecheck %s --check-prefix=OPTS
// Without --after-all only the layer IR is printed.
// RUN: k3c ir %examples/kda.toml | filecheck %s --check-prefix=LAYER
// The layer IR and the lowered IR both re-parse (k3c ir output is valid k3c opt input).
// RUN: k3c ir %examples/kda.toml | k3c opt - -p lower-recurrent | filecheck %s --check-prefix=REPARSED

// CHECK-LABEL: // -----// IR of spec {{.*}}examples/kda.toml //----- //
// CHECK-NEXT:  builtin.module {
// CHECK-NEXT:    k3.recurrence @kda <gate = channel, delta_rule = true, num_heads = 32, num_v_heads = 32, head_k_dim = 128, head_v_dim = 128, scale = 0.08838834764831845, state_layout = kv, dtype = bfloat16>
// CHECK-NEXT:  }
// CHECK-LABEL: // -----// IR after lower-recurrent //----- //
// CHECK-NEXT:  builtin.module {
// CHECK-NEXT:    k3.recurrence @kda
// CHECK-NEXT:    k3s.entry @recurrent <source = @kda> {
// CHECK-NEXT:      %q = k3s.tensor_arg @q <role = input> : !k3s.tensor<B x T x 32 x 128, float>
// CHECK-NEXT:      %k = k3s.tensor_arg @k <role = input> : !k3s.tensor<B x T x 32 x 128, float>
// CHECK-NEXT:      %v = k3s.tensor_arg @v <role = input> : !k3s.tensor<B x T x 32 x 128, float>
// CHECK-NEXT:      %g = k3s.tensor_arg @g <role = input> : !k3s.tensor<B x T x 32 x 128, float>
// CHECK-NEXT:      %beta = k3s.tensor_arg @beta <role = input> : !k3s.tensor<B x T x 32, float>
// CHECK-NEXT:      %scale = k3s.scalar_arg @scale <default = 0.08838834764831845> : f32
// CHECK-NEXT:      %initial_state = k3s.tensor_arg @initial_state <role = optional_input> : !k3s.tensor<N x 32 x 128 x 128, float32>
// CHECK-NEXT:      %o = k3s.tensor_arg @o <role = output> : !k3s.tensor<B x T x 32 x 128, float>
// CHECK-NEXT:      %final_state = k3s.tensor_arg @final_state <role = optional_output> : !k3s.tensor<N x 32 x 128 x 128, float32>
// CHECK-NEXT:      %cu_seqlens = k3s.tensor_arg @cu_seqlens <role = optional_input, purpose = sequence_offsets> : !k3s.tensor<N+1, offsets>
// CHECK-NEXT:      %A_log = k3s.tensor_arg @A_log <role = forbidden> : !k3s.tensor<32, float>
// CHECK-NEXT:      %dt_bias = k3s.tensor_arg @dt_bias <role = forbidden> : !k3s.tensor<4096, float>
// CHECK-NEXT:      k3s.kernel @kda_recurrent <grid = [value_block, sequence_head], num_warps = 4> {
// CHECK-NEXT:        %S = k3s.state_tile %initial_state <head_k_dim = 128, head_v_dim = 128, block_v = 32, layout = kv> : !k3s.tile<K x V>
// CHECK-NEXT:        %S_final = k3s.token_loop %S, %cu_seqlens {
// CHECK-NEXT:        ^bb0(%S_1: !k3s.tile<K x V>):
// CHECK-NEXT:          %[[q:[a-z_0-9]+]] = k3s.load_token %q : !k3s.tile<K>
// CHECK-NEXT:          %[[k:[a-z_0-9]+]] = k3s.load_token %k : !k3s.tile<K>
// CHECK-NEXT:          %[[v:[a-z_0-9]+]] = k3s.load_token %v : !k3s.tile<V>
// CHECK-NEXT:          %[[g:[a-z_0-9]+]] = k3s.load_gate %g <gate = channel, input = log, lower_bound = -5.0, floor = -110.0> : !k3s.tile<K>
// CHECK-NEXT:          %S_2 = k3s.decay %S_1, %[[g]] <gate = channel> : !k3s.tile<K x V>
// CHECK-NEXT:          %[[beta:[a-z_0-9]+]] = k3s.load_beta %beta <input = probability> : !k3s.tile<>
// CHECK-NEXT:          %u = k3s.delta_correct %S_2, %[[k]], %[[v]], %[[beta]] : !k3s.tile<V>
// CHECK-NEXT:          %S_3 = k3s.rank1_update %S_2, %[[k]], %u : !k3s.tile<K x V>
// CHECK-NEXT:          %{{[a-z_0-9]+}} = k3s.readout %S_3, %[[q]], %o, %scale : !k3s.tile<V>
// CHECK-NEXT:          k3s.next_token %S_3
// CHECK-NEXT:        } : !k3s.tile<K x V>
// CHECK-NEXT:        k3s.store_state %S_final, %final_state <layout = kv>
// CHECK-NEXT:      }
// CHECK-NEXT:    }
// CHECK-NEXT:  }

// OPTS-LABEL: // -----// IR after lower-recurrent //----- //
// OPTS:       k3s.kernel @kda_recurrent <grid = [value_block, sequence_head], num_warps = 8> {
// OPTS-NEXT:    %S = k3s.state_tile %initial_state <head_k_dim = 128, head_v_dim = 128, block_v = 64, layout = kv> : !k3s.tile<K x V>

// LAYER-NOT:  // -----//
// LAYER:      builtin.module {
// LAYER-NEXT:   k3.recurrence @kda <gate = channel, delta_rule = true,
// LAYER-NEXT: }
// LAYER-NOT:  k3s.

// REPARSED:      %S_final = k3s.token_loop %S, %cu_seqlens {
// REPARSED-NEXT: ^bb0(%S_1: !k3s.tile<K x V>):
// REPARSED-NEXT:   %[[q:[a-z_0-9]+]] = k3s.load_token %q : !k3s.tile<K>
// REPARSED-NEXT:   %[[k:[a-z_0-9]+]] = k3s.load_token %k : !k3s.tile<K>
// REPARSED-NEXT:   %[[v:[a-z_0-9]+]] = k3s.load_token %v : !k3s.tile<V>
// REPARSED-NEXT:   %[[g:[a-z_0-9]+]] = k3s.load_gate %g <gate = channel, input = log, lower_bound = -5.0, floor = -110.0> : !k3s.tile<K>
// REPARSED-NEXT:   %S_2 = k3s.decay %S_1, %[[g]] <gate = channel> : !k3s.tile<K x V>
// REPARSED-NEXT:   %[[beta:[a-z_0-9]+]] = k3s.load_beta %beta <input = probability> : !k3s.tile<>
// REPARSED-NEXT:   %u = k3s.delta_correct %S_2, %[[k]], %[[v]], %[[beta]] : !k3s.tile<V>
// REPARSED-NEXT:   %S_3 = k3s.rank1_update %S_2, %[[k]], %u : !k3s.tile<K x V>
// REPARSED-NEXT:   %{{[a-z_0-9]+}} = k3s.readout %S_3, %[[q]], %o, %scale : !k3s.tile<V>
// REPARSED-NEXT:   k3s.next_token %S_3
// REPARSED-NEXT: } : !k3s.tile<K x V>
