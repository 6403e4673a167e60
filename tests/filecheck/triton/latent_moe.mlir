// The printed Triton of the LatentMoE spec's router (K3's dims): a logits kernel over blocks of
// experts x blocks of rows x slices of the hidden columns that stores each slice's partial
// x W_r^T in the `partial_logits` workspace [HS, R, E], then a top-k kernel over blocks of rows
// that sums the slices in order and applies the sigmoid before it selects. The entry sets the
// slice count HS by the call's rows before it allocates the workspace; each launch takes the
// block sizes of its k3s.launch_by_rows ops by the call's rows (legalize-triton: narrow tiles,
// hidden slices and many programs for a few rows), else the kernel's own (k3c compile --stdout).
// RUN: k3c compile %examples/latent_moe.toml --stdout --no-autotune | filecheck %s

// CHECK-LABEL: def latent_moe_router_logits_kernel(
// CHECK:      # grid axis 0: a block of BE experts
// CHECK:      # grid axis 1: a block of BR token rows
// CHECK:      # grid axis 2: slice i_hs of the HS slices of the hidden columns
// CHECK-NEXT: i_hs = tl.program_id(2)
// CHECK:      # %logits = k3s.router_logits %x, %router_weight <hidden_size = 7168, num_experts = 896>
// CHECK:      for i_d in range(i_hs * tl.cdiv(D, BD) // HS, (i_hs + 1) * tl.cdiv(D, BD) // HS):
// CHECK:          b_logits += _mm(b_x, b_wt, DOT)
// CHECK-NOT:  tl.sigmoid
// CHECK:      # k3s.store_partial_logits %logits, %partial_logits
// CHECK-NEXT: tl.store(partial_logits + (i_hs * R + o_r[:, None]) * E + o_e[None, :], b_logits, mask=m_r[:, None] & m_e[None, :])
// CHECK-LABEL: def latent_moe_router_top_k_kernel(
// CHECK:      # %logits = k3s.sum_partial_logits %partial_logits <num_experts = 896>
// CHECK:      b_logits = tl.zeros([BR, BE], dtype=tl.float32)
// CHECK-NEXT: for i_hs in range(HS):
// CHECK-NEXT:     b_logits += tl.load(partial_logits + (i_hs * R + o_r[:, None]) * E + o_e[None, :], mask=m_r[:, None] & m_e[None, :], other=0.0)
// CHECK-NEXT: # %s = k3s.router_sigmoid %logits
// CHECK-NEXT: b_s = tl.sigmoid(b_logits)
// CHECK:      # %ids, %w = k3s.select_top_k %s, %router_bias <top_k = 16>
// CHECK:      # k3s.store_routing %ids, %weights, %topk_ids, %topk_weights
// CHECK-LABEL: def route(x, router_weight, router_bias):
// CHECK:      # the hidden slices of the router kernel at this call's rows
// CHECK-NEXT: dims["HS"] = 1
// CHECK-NEXT: if dims["R"] <= 16:
// CHECK-NEXT:     dims["HS"] = 8
// CHECK-NEXT: elif dims["R"] <= 128:
// CHECK-NEXT:     dims["HS"] = 4
// CHECK-NEXT: topk_ids = _alloc(
// CHECK:      partial_logits = _alloc((dims["HS"], dims["R"], 896), torch.float32, x.device)
// CHECK:      # k3s.kernel @latent_moe_router_logits <grid = [expert_block, row_block, hidden_slice], num_warps = 8, dots = input, block_d = 64, block_r = 128, block_e = 128, hidden_slices = 1, launch_params = [R, HS]>: launch
// CHECK:      # k3s.launch_by_rows <kernel = @latent_moe_router_logits, max_rows = 16, block_r = 16, block_e = 16, block_d = 128, hidden_slices = 8>
// CHECK-NEXT: if dims["R"] <= 16:
// CHECK-NEXT:     BR, BE, BD = 16, 16, 128
// CHECK-NEXT: # k3s.launch_by_rows <kernel = @latent_moe_router_logits, max_rows = 128, block_r = 16, block_e = 16, block_d = 256, hidden_slices = 4>
// CHECK-NEXT: elif dims["R"] <= 128:
// CHECK-NEXT:     BR, BE, BD = 16, 16, 256
// CHECK-NEXT: # k3s.launch_by_rows <kernel = @latent_moe_router_logits, max_rows = 512, block_r = 32, block_e = 32, block_d = 128, hidden_slices = 1>
// CHECK-NEXT: elif dims["R"] <= 512:
// CHECK-NEXT:     BR, BE, BD = 32, 32, 128
// CHECK-NEXT: # k3s.launch_by_rows <kernel = @latent_moe_router_logits, max_rows = 2048, block_r = 64, block_e = 64, block_d = 64, hidden_slices = 1>
// CHECK-NEXT: elif dims["R"] <= 2048:
// CHECK-NEXT:     BR, BE, BD = 64, 64, 64
// CHECK-NEXT: grid = (triton.cdiv(E, BE), triton.cdiv(dims["R"], BR), dims["HS"])
// CHECK:      latent_moe_router_logits_kernel[grid](
// CHECK:          dims["HS"],
// CHECK:      # k3s.kernel @latent_moe_router_top_k <grid = [row_block], num_warps = 8, block_r = 16, block_e = 1024, block_ks = 16, launch_params = [R, HS]>: launch
// CHECK:      # k3s.launch_by_rows <kernel = @latent_moe_router_top_k, max_rows = 256, block_r = 1>
// CHECK-NEXT: if dims["R"] <= 256:
// CHECK-NEXT:     BR = 1
// CHECK:      elif dims["R"] <= 1024:
// CHECK-NEXT:     BR = 4
// CHECK-NEXT: grid = (triton.cdiv(dims["R"], BR),)
// CHECK:      latent_moe_router_top_k_kernel[grid](
// CHECK:          dims["HS"],
// CHECK:      __all__ = ['route', 'moe_prefill', 'moe_decode', 'moe_decode_warp', 'moe_forward', 'moe_backward', 'moe']
