// derive-moe-backward's choices of form. glu-adjoint=kernel: the down projections' dgrads store
// their product plainly at dgrad-block-n columns (the input dtype, shaped as the forward's input
// rows) and the GLU's adjoint runs in a row kernel of its own over the forward's rows, whose
// first k3s.load_rows is its rows (over the pair list it takes the list's tensors); the routing
// weight's terms the dgrad left (the partial row dots, one per block of row-kernel-block-n
// columns, and the scale) come before the adjoint there. sorted-wgrad-rows=copy: each operand a
// routed expert's wgrad gathers by token is copied in the pair list's order first (times the
// routing weight: the down wgrad's scale folded into its cotangent's copy) and the wgrad reads
// two operands by position, unscaled. sorted-wgrad-block-r: the routed wgrads' rows a step, apart
// from the dense wgrads' wgrad-block-r. Options outside their words are refused.
// RUN: k3c opt %s -p 'lower-moe-routing,lower-moe-experts,derive-moe-backward{glu-adjoint=kernel}' | filecheck %s --check-prefix=KERNEL
// RUN: k3c opt %s -p 'lower-moe-routing,lower-moe-experts,derive-moe-backward{glu-adjoint=kernel row-kernel-block-n=16}' | filecheck %s --check-prefix=N16
// RUN: k3c opt %s -p 'lower-moe-routing,lower-moe-experts,derive-moe-backward{sorted-wgrad-rows=copy}' | filecheck %s --check-prefix=COPY
// RUN: k3c compile %examples/latent_moe.toml --stdout --no-autotune -p 'lower-moe-routing,lower-moe-experts,derive-moe-backward{glu-adjoint=kernel sorted-wgrad-rows=copy},outline-kernels' | filecheck %s --check-prefix=PRINTED
// RUN: k3c opt %s -p 'lower-moe-routing,lower-moe-experts,derive-moe-backward{sorted-wgrad-block-r=16 wgrad-block-r=32}' | filecheck %s --check-prefix=STEP
// RUN: not k3c opt %s -p 'derive-moe-backward{glu-adjoint=prologue}' 2>&1 | filecheck %s --check-prefix=BAD-GLU
// RUN: not k3c opt %s -p 'derive-moe-backward{sorted-wgrad-rows=tma}' 2>&1 | filecheck %s --check-prefix=BAD-ROWS
// RUN: not k3c opt %s -p 'derive-moe-backward{row-kernel-block-n=24}' 2>&1 | filecheck %s --check-prefix=BAD-BLOCK
// RUN: not k3c opt %s -p 'derive-moe-backward{sorted-wgrad-block-r=8}' 2>&1 | filecheck %s --check-prefix=BAD-STEP

builtin.module {
  k3.latent_moe @mlp <hidden_size = 40, latent_dim = 16, num_experts = 12, top_k = 3, expert_ffn_dim = 32, num_shared_experts = 1, shared_ffn_dim = 24, activation = situ_glu, norm_topk_prob = true, routed_scaling_factor = 2.5, eps = 1.0e-06, dtype = bfloat16>
}

// KERNEL:      k3s.entry @moe_backward
// KERNEL:        k3s.tensor_arg @shared_act_bar <role = workspace> : !k3s.tensor<R x 24, float>
// KERNEL:        k3s.tensor_arg @topk_weights_bar_partials <role = workspace> : !k3s.tensor<R x 3 x 1, float32>
// KERNEL-NEXT:   k3s.tensor_arg @expert_act_bar <role = workspace> : !k3s.tensor<PP x 32, float>
// the shared experts' down dgrad: a plain store at dgrad-block-n (the shared FFN's 24 columns: 32)
// KERNEL:        k3s.kernel @mlp_backward_shared_down_dgrad <grid = {{.+}}, num_warps = 8, num_stages = 3, block_d = 64, block_r = 128, block_n = 32> {
// KERNEL-NEXT:     %a_bar = k3s.project_input_grad %dout, %shared_down
// KERNEL-NEXT:     k3s.store_rows %a_bar, %shared_act_bar <rows = token_block, index = token, width = 24, accumulate = false>
// KERNEL-NEXT:   }
// KERNEL:        k3s.kernel @mlp_backward_shared_act_glu_adjoint <grid = {{.+}}, num_warps = 8, block_r = 128, block_n = 32> {
// KERNEL-NEXT:     %shared_act_bar_rows = k3s.load_rows %shared_act_bar <rows = token_block, index = token, width = 24>
// KERNEL-NEXT:     %g, %u = k3s.load_glu_halves %shared_gu <rows = token_block, index = token, group = 24, width = 48>
// KERNEL-NEXT:     %g_bar, %u_bar = k3s.glu_adjoint %g, %u, %shared_act_bar_rows <activation = situ_glu>
// KERNEL-NEXT:     k3s.store_glu_halves %g_bar, %u_bar, %shared_gate_up_out_bar <rows = token_block, index = token, group = 24, width = 48>
// KERNEL-NEXT:   }
// KERNEL-NEXT:   k3s.kernel @mlp_backward_shared_gate_up_dgrad
// KERNEL-NEXT:     k3s.project_input_grad %shared_gate_up_out_bar, %shared_gate_up
// the routed experts' down dgrad stores y_bar W before the routing weight's terms
// KERNEL:        k3s.kernel @mlp_backward_expert_down_dgrad <grid = {{.+}}, num_warps = 8, num_stages = 3, block_d = 16, block_n = 32> {
// KERNEL-NEXT:     %yw_bar_w = k3s.project_input_grad %combined_bar, %expert_down, %expert_offsets, %sorted_pairs, %block_expert
// KERNEL-NEXT:     k3s.store_rows %yw_bar_w, %expert_act_bar <rows = sorted_block, index = position, width = 32, accumulate = false>
// KERNEL-NEXT:   }
// KERNEL-NEXT:   k3s.kernel @mlp_backward_expert_down_wgrad
// KERNEL-NEXT:     k3s.project_weight_grad %combined_bar, %expert_act, %topk_weights, %expert_offsets, %sorted_pairs <{{.*}}scale_rows = true
// KERNEL:        k3s.kernel @mlp_backward_expert_act_glu_adjoint <grid = {{.+}}, num_warps = 8, block_r = 128, block_n = 32> {
// KERNEL-NEXT:     %expert_act_bar_rows = k3s.load_rows %expert_act_bar, %expert_offsets, %sorted_pairs, %block_expert <rows = sorted_block, index = position, width = 32>
// KERNEL-NEXT:     %a = k3s.load_rows %expert_act <rows = sorted_block, index = position, width = 32>
// KERNEL-NEXT:     k3s.store_pair_dot %expert_act_bar_rows, %a, %topk_weights_bar_partials
// KERNEL-NEXT:     %a_bar = k3s.weigh_pairs %expert_act_bar_rows, %topk_weights
// KERNEL-NEXT:     %g, %u = k3s.load_glu_halves %expert_gu <rows = sorted_block, index = position, group = 32, width = 64>
// KERNEL-NEXT:     %g_bar, %u_bar = k3s.glu_adjoint %g, %u, %a_bar <activation = situ_glu>
// KERNEL-NEXT:     k3s.store_glu_halves %g_bar, %u_bar, %expert_gate_up_out_bar <rows = sorted_block, index = position, group = 32, width = 64>
// KERNEL-NEXT:   }
// KERNEL-NEXT:   k3s.kernel @mlp_backward_expert_gate_up_dgrad
// KERNEL-NEXT:     k3s.project_input_grad %expert_gate_up_out_bar, %expert_gate_up

// two blocks of the FFN's 32 columns a pair: two partial row dots, summed in order by the router's adjoint
// N16:          k3s.tensor_arg @topk_weights_bar_partials <role = workspace> : !k3s.tensor<R x 3 x 2, float32>
// N16:          k3s.kernel @mlp_backward_expert_act_glu_adjoint <grid = {{.+}}, num_warps = 8, block_r = 128, block_n = 16> {
// N16:          k3s.sum_partials %topk_weights_bar_partials

// COPY:         k3s.tensor_arg @combined_bar_pair_rows <role = workspace> : !k3s.tensor<PP x 16, float>
// COPY:         k3s.tensor_arg @h_pair_rows <role = workspace> : !k3s.tensor<PP x 16, float>
// COPY:         k3s.kernel @mlp_backward_combined_bar_pair_rows <grid = {{.+}}, num_warps = 8, block_r = 128, block_n = 16> {
// COPY-NEXT:      %combined_bar_rows = k3s.load_rows %combined_bar, %expert_offsets, %sorted_pairs, %block_expert <rows = sorted_block, index = token, width = 16>
// COPY-NEXT:      %combined_bar_rows_weighted = k3s.weigh_pairs %combined_bar_rows, %topk_weights
// COPY-NEXT:      k3s.store_rows %combined_bar_rows_weighted, %combined_bar_pair_rows <rows = sorted_block, index = position, width = 16, accumulate = false>
// COPY-NEXT:    }
// COPY-NEXT:    k3s.kernel @mlp_backward_expert_down_wgrad
// COPY-NEXT:      k3s.project_weight_grad %combined_bar_pair_rows, %expert_act, %expert_offsets, %sorted_pairs <in_dim = 32, out_dim = 16, rows = sorted_block, cotangent_index = position, input_index = position, scale_rows = false, block_rows = 128>
// the GLU's adjoint stays in the down dgrad's epilogue (glu-adjoint=epilogue)
// COPY:         k3s.kernel @mlp_backward_expert_down_dgrad
// COPY:           k3s.glu_adjoint
// COPY:         k3s.kernel @mlp_backward_h_pair_rows <grid = {{.+}}, num_warps = 8, block_r = 128, block_n = 16> {
// COPY-NEXT:      %h_rows = k3s.load_rows %h, %expert_offsets, %sorted_pairs, %block_expert <rows = sorted_block, index = token, width = 16>
// COPY-NEXT:      k3s.store_rows %h_rows, %h_pair_rows <rows = sorted_block, index = position, width = 16, accumulate = false>
// COPY-NEXT:    }
// COPY-NEXT:    k3s.kernel @mlp_backward_expert_gate_up_wgrad
// COPY-NEXT:      k3s.project_weight_grad %expert_gate_up_out_bar, %h_pair_rows, %expert_offsets, %sorted_pairs <in_dim = 16, out_dim = 64, rows = sorted_block, cotangent_index = position, input_index = position, scale_rows = false, block_rows = 128>

// at K3's widths: the down dgrad 256 columns wide, the row kernel's rows a block of the pair list
// (the sorted_block axis reads its k3s.load_rows' tensors), 64 columns: 48 partials a pair
// PRINTED-LABEL: def latent_moe_backward_expert_down_dgrad_kernel(
// PRINTED:         b_yw_bar_w = tl.zeros([BM, BN], dtype=tl.float32)
// PRINTED:         tl.store(expert_act_bar + o_s[:, None] * 3072 + o_n[None, :], b_yw_bar_w.to(expert_act_bar.dtype.element_ty), mask=m_s[:, None] & m_n[None, :])
// PRINTED-LABEL: def latent_moe_backward_combined_bar_pair_rows_kernel(
// PRINTED:         b_combined_bar_rows = tl.load(combined_bar + o_t[:, None] * 3584 + o_n[None, :], mask=m_s[:, None] & m_n[None, :], other=0.0).to(tl.float32)
// PRINTED:         tl.store(combined_bar_pair_rows + o_s[:, None] * 3584 + o_n[None, :], b_combined_bar_rows_weighted.to(combined_bar_pair_rows.dtype.element_ty), mask=m_s[:, None] & m_n[None, :])
// PRINTED-LABEL: def latent_moe_backward_expert_down_wgrad_kernel(
// PRINTED:         b_dy = tl.load(combined_bar_pair_rows + o_s[:, None] * DOUT + o_n[None, :], mask=m_s[:, None] & m_n[None, :], other=0.0)
// PRINTED-NEXT:    b_a = tl.load(expert_act + o_s[:, None] * DIN + o_d[None, :], mask=m_s[:, None] & m_d[None, :], other=0.0)
// PRINTED-NEXT:    b_w_bar += _mm(tl.trans(b_dy), b_a, DOT)
// PRINTED-LABEL: def latent_moe_backward_expert_act_glu_adjoint_kernel(
// PRINTED:         # grid axis 1: a block of BM positions of the expert-sorted pair list, all of one expert
// PRINTED:         b_pairs = tl.load(sorted_pairs + o_s).to(tl.int64)
// PRINTED:         b_expert_act_bar_rows = tl.load(expert_act_bar + o_s[:, None] * 3072 + o_n[None, :], mask=m_s[:, None] & m_n[None, :], other=0.0).to(tl.float32)
// PRINTED:         tl.store(topk_weights_bar_partials + b_pairs * 48 + tl.program_id(0), tl.sum(b_expert_act_bar_rows * b_a, axis=1), mask=m_s)
// PRINTED:         b_a_bar = b_expert_act_bar_rows * tl.load(topk_weights + b_pairs, mask=m_s, other=0.0)[:, None]
// PRINTED:       def moe_backward(
// PRINTED:         # k3s.kernel @latent_moe_backward_expert_act_glu_adjoint <{{.+}}>: launch
// PRINTED-NEXT:    DOUT = 3072
// PRINTED-NEXT:    BN = 64
// PRINTED-NEXT:    TOP_K = 16
// PRINTED-NEXT:    E = 896
// PRINTED-NEXT:    BM = 128

// STEP:         k3s.kernel @mlp_backward_shared_down_wgrad <grid = {{.+}}, num_warps = 8, num_stages = 3, block_d = 32, block_r = 32, block_n = 64>
// STEP:         k3s.kernel @mlp_backward_expert_down_wgrad <grid = {{.+}}, num_warps = 8, num_stages = 5, block_d = 32, block_r = 16, block_n = 16>
// STEP:         k3s.kernel @mlp_backward_expert_gate_up_wgrad <grid = {{.+}}, num_warps = 8, num_stages = 5, block_d = 16, block_r = 16, block_n = 64>
// STEP:         k3s.kernel @mlp_backward_latent_down_wgrad <grid = {{.+}}, num_warps = 8, num_stages = 3, block_d = 64, block_r = 32, block_n = 16>

// BAD-GLU: derive-moe-backward: glu-adjoint must be one of epilogue, kernel, got prologue
// BAD-ROWS: derive-moe-backward: sorted-wgrad-rows must be one of gather, copy, got tma
// BAD-BLOCK: derive-moe-backward: row-kernel-block-n
// BAD-STEP: derive-moe-backward: sorted-wgrad-block-r must be at least 16 (the depth of its tl.dot), got 8
