// Spec-driven: the AttnRes example lowers with fuse-attnres (max_sources = num_blocks + 1 = 9,
// eps carried into the score), then derive-attnres-backward adds its backward (the same bound and
// eps, K3's width in four times the forward's warps); the LatentMoE example lowers its router with lower-moe-routing
// (K3's 896 experts, top-16, the scaling and normalisation from the spec), then its experts with
// lower-moe-experts (moe_prefill, moe_decode, and moe choosing between them).
// RUN: k3c ir %examples/attnres.toml --after-all | filecheck %s --check-prefix=AR
// RUN: k3c ir %examples/latent_moe.toml --after-all | filecheck %s --check-prefix=MOE

// AR-LABEL: // -----// IR of spec
// AR:       k3.attnres @attnres <hidden_size = 7168, num_blocks = 8, block_size = 12, eps = 1.0e-06, dtype = bfloat16>
// AR-LABEL: // -----// IR after fuse-attnres //----- //
// AR:       k3s.entry @aggregate <source = @attnres, max_sources = 9> {
// AR-NEXT:    %sources = k3s.tensor_arg @sources <role = input> : !k3s.tensor<S x B x T x 7168, float>
// AR-NEXT:    %query = k3s.tensor_arg @query <role = input> : !k3s.tensor<7168, float>
// AR-NEXT:    %gain = k3s.tensor_arg @gain <role = input> : !k3s.tensor<7168, float>
// AR-NEXT:    %out = k3s.tensor_arg @out <role = output> : !k3s.tensor<B x T x 7168, float>
// AR-NEXT:    %lse = k3s.tensor_arg @lse <role = optional_output> : !k3s.tensor<B x T, float32>
// AR-NEXT:    k3s.kernel @attnres_aggregate <grid = [row], num_warps = 4, num_stages = 3, max_rows = 2047> {
// AR-NEXT:      %q = k3s.fold_query %query, %gain <hidden_size = 7168> : !k3s.tile<D>
// AR-NEXT:      %max, %sum, %acc = k3s.softmax_start : !k3s.tile<>, !k3s.tile<>, !k3s.tile<D>
// AR-NEXT:      %max_1, %sum_1, %acc_1 = k3s.source_loop %max, %sum, %acc {
// AR-NEXT:      ^bb0(%max_2: !k3s.tile<>, %sum_2: !k3s.tile<>, %acc_2: !k3s.tile<D>):
// AR-NEXT:        %x = k3s.load_source %sources : !k3s.tile<D>
// AR-NEXT:        %score = k3s.rms_score %x, %q <eps = 1.0e-06> : !k3s.tile<>
// AR-NEXT:        %max_3, %sum_3, %p, %rescale = k3s.online_softmax %max_2, %sum_2, %score : !k3s.tile<>, !k3s.tile<>, !k3s.tile<>, !k3s.tile<>
// AR-NEXT:        %acc_3 = k3s.mix_accumulate %acc_2, %rescale, %p, %x : !k3s.tile<D>
// AR-NEXT:        k3s.next_source %max_3, %sum_3, %acc_3
// AR-NEXT:      } : !k3s.tile<>, !k3s.tile<>, !k3s.tile<D>
// AR-NEXT:      k3s.normalize_store %acc_1, %sum_1, %out
// AR-NEXT:      k3s.store_lse %max_1, %sum_1, %lse
// AR-NEXT:    }
// AR-NEXT:    k3s.kernel @attnres_aggregate_groups <grid = [row_group], num_warps = 4, num_stages = 4, min_rows = 2048> {
// AR-NEXT:      %q = k3s.fold_query %query, %gain <hidden_size = 7168> : !k3s.tile<D>
// AR-NEXT:      %max, %sum, %acc = k3s.softmax_start : !k3s.tile<>, !k3s.tile<>, !k3s.tile<D>
// AR-NEXT:      %max_1, %sum_1, %acc_1 = k3s.row_source_loop %max, %sum, %acc <rows = 8> {
// AR-NEXT:      ^bb0(%max_2: !k3s.tile<>, %sum_2: !k3s.tile<>, %acc_2: !k3s.tile<D>):
// AR-NEXT:        %max_3 = k3s.row_start %max_2 : !k3s.tile<>
// AR-NEXT:        %x = k3s.load_source %sources : !k3s.tile<D>
// AR-NEXT:        %score = k3s.rms_score %x, %q <eps = 1.0e-06> : !k3s.tile<>
// AR-NEXT:        %max_4, %sum_3, %p, %rescale = k3s.online_softmax %max_3, %sum_2, %score : !k3s.tile<>, !k3s.tile<>, !k3s.tile<>, !k3s.tile<>
// AR-NEXT:        %acc_3 = k3s.mix_accumulate %acc_2, %rescale, %p, %x : !k3s.tile<D>
// AR-NEXT:        k3s.at_row_end {
// AR-NEXT:          k3s.normalize_store %acc_3, %sum_3, %out
// AR-NEXT:          k3s.store_lse %max_4, %sum_3, %lse
// AR-NEXT:        }
// AR-NEXT:        k3s.next_source %max_4, %sum_3, %acc_3
// AR-NEXT:      } : !k3s.tile<>, !k3s.tile<>, !k3s.tile<D>
// AR-NEXT:    }
// AR-LABEL: // -----// IR after derive-attnres-backward //----- //
// AR:       k3s.entry @aggregate_backward <source = @attnres, max_sources = 9> {
// AR:         k3s.kernel @attnres_aggregate_backward <grid = [row_group], num_warps = 16, num_stages = 3> {
// AR-NEXT:      %q = k3s.fold_query %query, %gain <hidden_size = 7168> : !k3s.tile<D>
// AR:             %score = k3s.rms_score %x, %q <eps = 1.0e-06> : !k3s.tile<>
// AR:             %x_bar = k3s.rms_score_adjoint %x, %q, %score, %score_bar <eps = 1.0e-06> : !k3s.tile<D>
// AR:             k3s.query_adjoint %x, %p, %score_bar, %q_bar_4, %k_mean_2, %score_bar_sum_2 <eps = 1.0e-06>

// MOE:      // -----// IR of spec
// MOE-NEXT: builtin.module {
// MOE-NEXT:   k3.latent_moe @latent_moe <hidden_size = 7168, latent_dim = 3584, num_experts = 896, top_k = 16, expert_ffn_dim = 3072, num_shared_experts = 2, shared_ffn_dim = 3072, activation = situ_glu, norm_topk_prob = true, routed_scaling_factor = 1.0, eps = 1.0e-06, dtype = bfloat16>
// MOE-NEXT: }
// MOE-LABEL: // -----// IR after lower-moe-routing //----- //
// MOE:        k3s.entry @route <source = @latent_moe> {
// MOE-NEXT:     %x = k3s.tensor_arg @x <role = input> : !k3s.tensor<R x 7168, float>
// MOE-NEXT:     %router_weight = k3s.tensor_arg @router_weight <role = input> : !k3s.tensor<896 x 7168, float>
// MOE-NEXT:     %router_bias = k3s.tensor_arg @router_bias <role = input> : !k3s.tensor<896, float32>
// MOE-NEXT:     %topk_ids = k3s.tensor_arg @topk_ids <role = output> : !k3s.tensor<R x 16, index>
// MOE-NEXT:     %topk_weights = k3s.tensor_arg @topk_weights <role = output> : !k3s.tensor<R x 16, float32>
// MOE-NEXT:     %partial_logits = k3s.tensor_arg @partial_logits <role = workspace> : !k3s.tensor<HS x R x 896, float32>
// MOE-NEXT:     k3s.kernel @latent_moe_router_logits <grid = [expert_block, row_block, hidden_slice], num_warps = 8> {
// MOE-NEXT:       %logits = k3s.router_logits %x, %router_weight <hidden_size = 7168, num_experts = 896> : !k3s.tile<R x E>
// MOE-NEXT:       k3s.store_partial_logits %logits, %partial_logits
// MOE:          k3s.kernel @latent_moe_router_top_k <grid = [row_block], num_warps = 8> {
// MOE-NEXT:       %logits = k3s.sum_partial_logits %partial_logits <num_experts = 896> : !k3s.tile<R x E>
// MOE:            %ids, %w = k3s.select_top_k %s, %router_bias <top_k = 16> : !k3s.tile<R x KS>, !k3s.tile<R x KS>
// MOE-NEXT:       %weights = k3s.routing_weights %w <normalize = true, scale = 1.0> : !k3s.tile<R x KS>
// MOE-NEXT:       k3s.store_routing %ids, %weights, %topk_ids, %topk_weights
// MOE-LABEL: // -----// IR after lower-moe-experts //----- //
// MOE:        k3s.entry @moe_prefill <source = @latent_moe> {
// MOE:        k3s.entry @moe_decode <source = @latent_moe> {
// MOE:        k3s.entry_by_rows @moe <source = @latent_moe, entries = [@moe_decode, @moe_decode_warp, @moe_prefill]
