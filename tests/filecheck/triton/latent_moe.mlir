// The printed Triton of the LatentMoE spec's router (K3's dims): a scores kernel over blocks of
// experts x blocks of rows that stores sigmoid(x W_r^T) in the `scores` workspace, then a top-k
// kernel over blocks of rows; each launch takes the block sizes of its k3s.launch_by_rows ops by
// the call's rows (legalize-triton: narrow tiles and many programs for a few rows), else the
// kernel's own (k3c compile --stdout).
// RUN: k3c compile %examples/latent_moe.toml --stdout --no-autotune | filecheck %s

// CHECK-LABEL: def latent_moe_router_scores_kernel(
// CHECK:      # grid axis 0: a block of BE experts
// CHECK:      # grid axis 1: a block of BR token rows
// CHECK:      # %logits = k3s.router_logits <hidden_size = 7168, num_experts = 896>
// CHECK:          b_logits += _mm(b_x, b_wt, DOT)
// CHECK:      # %s = k3s.router_sigmoid %logits
// CHECK:      # k3s.store_scores %s
// CHECK-NEXT: tl.store(scores + o_r[:, None] * E + o_e[None, :], b_s, mask=m_r[:, None] & m_e[None, :])
// CHECK-LABEL: def latent_moe_router_top_k_kernel(
// CHECK:      # %s = k3s.load_scores <num_experts = 896>
// CHECK:      # %ids, %w = k3s.select_top_k %s <top_k = 16>
// CHECK:      # k3s.store_routing %ids, %weights
// CHECK-LABEL: def route(x, router_weight, router_bias):
// CHECK:      scores = _alloc((dims["R"], 896), torch.float32, x.device)
// CHECK:      # k3s.kernel @latent_moe_router_scores <grid = "expert_block,row_block", num_warps = 8, block_d = 64, block_r = 128, block_e = 128>: launch
// CHECK:      # k3s.launch_by_rows <kernel = latent_moe_router_scores, max_rows = 128, block_r = 16, block_e = 16, block_d = 256>
// CHECK-NEXT: if dims["R"] <= 128:
// CHECK-NEXT:     BR, BE, BD = 16, 16, 256
// CHECK-NEXT: # k3s.launch_by_rows <kernel = latent_moe_router_scores, max_rows = 512, block_r = 32, block_e = 32, block_d = 128>
// CHECK-NEXT: elif dims["R"] <= 512:
// CHECK-NEXT:     BR, BE, BD = 32, 32, 128
// CHECK-NEXT: # k3s.launch_by_rows <kernel = latent_moe_router_scores, max_rows = 2048, block_r = 64, block_e = 64, block_d = 64>
// CHECK-NEXT: elif dims["R"] <= 2048:
// CHECK-NEXT:     BR, BE, BD = 64, 64, 64
// CHECK-NEXT: grid = (triton.cdiv(E, BE), triton.cdiv(dims["R"], BR))
// CHECK:      latent_moe_router_scores_kernel[grid](
// CHECK:      # k3s.kernel @latent_moe_router_top_k <grid = row_block, num_warps = 8, block_r = 16, block_e = 1024, block_ks = 16>: launch
// CHECK:      # k3s.launch_by_rows <kernel = latent_moe_router_top_k, max_rows = 256, block_r = 1>
// CHECK-NEXT: if dims["R"] <= 256:
// CHECK-NEXT:     BR = 1
// CHECK:      elif dims["R"] <= 1024:
// CHECK-NEXT:     BR = 4
// CHECK-NEXT: grid = (triton.cdiv(dims["R"], BR),)
// CHECK:      latent_moe_router_top_k_kernel[grid](
// CHECK:      __all__ = ['route', 'moe_prefill', 'moe_decode', 'moe']
