// The printed Triton of K3's LatentMoE with MXFP4 expert weights (examples/latent_moe_mxfp4.toml):
// the module carries the MXFP4 runtime (pack_expert_weights, _check_mx, the dequantisation) and
// exports pack_expert_weights; the entries take each expert weight as packed values and scales,
// checked as uint8; the expert-centric projections dequantise a [BD / 2, BN] byte tile to two
// fp32 tiles (low and high nibbles) and take two dots of half the depth against the activations'
// matching columns (o_k and o_k + 16 of each block of 32); the token-centric ones multiply
// [BN, blocks, 16] tiles, each block's scale broadcast. The dense projections stay as they are
// (k3c compile --stdout).
// RUN: k3c compile %examples/latent_moe_mxfp4.toml --stdout --no-autotune | filecheck %s

// CHECK-LABEL: def pack_expert_weights(expert_gate_up, expert_down, layout=None):
// CHECK-LABEL: def _check_mx(name, x, shape, dtype_class, dims, device):
// CHECK-LABEL: def _mxfp4_dequant(packed, scales):
// CHECK:       _MXFP4_PACKING = "nibbles"
// CHECK-LABEL: def latent_moe_mxfp4_prefill_latent_down_kernel(
// CHECK:           b_w = tl.load(latent_down + o_n[None, :] * DIN + o_k[:, None], mask=m_k[:, None] & m_n[None, :], other=0.0)
// CHECK-LABEL: def latent_moe_mxfp4_prefill_expert_gate_up_kernel(
// CHECK-NEXT:      expert_gate_up_packed,
// CHECK-NEXT:      expert_gate_up_scales,
// CHECK:       # %g, %u = k3s.project %h, %expert_gate_up_packed, %expert_gate_up_scales, %expert_offsets, %sorted_pairs, %block_expert <{{.*}}weight_format = mxfp4>: fp32 accumulation over blocks of BD input columns; MXFP4 weights dequantised in registers
// CHECK:       for i_k in range(0, tl.cdiv(DIN, BD)):
// CHECK-NEXT:      o_kb = i_k * (BD // 2) + tl.arange(0, BD // 2)
// CHECK-NEXT:      m_kb = o_kb < DIN // 2
// CHECK-NEXT:      o_k = o_kb // 16 * 32 + o_kb % 16
// CHECK-NEXT:      b_a_lo = tl.load(h + o_t[:, None] * DIN + o_k[None, :], mask=m_s[:, None] & m_kb[None, :], other=0.0)
// CHECK-NEXT:      b_a_hi = tl.load(h + o_t[:, None] * DIN + 16 + o_k[None, :], mask=m_s[:, None] & m_kb[None, :], other=0.0)
// CHECK-NEXT:      b_w_lo, b_w_hi = _mxfp4_dequant(tl.load(expert_gate_up_packed + i_e * 2 * DOUT * (DIN // 2) + o_n[None, :] * (DIN // 2) + o_kb[:, None], mask=m_kb[:, None] & m_n[None, :], other=0), tl.load(expert_gate_up_scales + i_e * 2 * DOUT * (DIN // 32) + o_n[None, :] * (DIN // 32) + (o_kb // 16)[:, None], mask=m_kb[:, None] & m_n[None, :], other=0))
// CHECK-NEXT:      b_g += _mm(b_a_lo, b_w_lo, DOT) + _mm(b_a_hi, b_w_hi, DOT)
// CHECK-NEXT:      b_w_lo, b_w_hi = _mxfp4_dequant(tl.load(expert_gate_up_packed + i_e * 2 * DOUT * (DIN // 2) + (1 * DOUT + o_n)[None, :] * (DIN // 2)
// CHECK-NEXT:      b_u += _mm(b_a_lo, b_w_lo, DOT) + _mm(b_a_hi, b_w_hi, DOT)
// CHECK-LABEL: def latent_moe_mxfp4_prefill_expert_down_kernel(
// CHECK:           b_y += _mm(b_a_lo, b_w_lo, DOT) + _mm(b_a_hi, b_w_hi, DOT)
// CHECK-LABEL: def moe_prefill(x, router_weight, router_bias, expert_gate_up_packed, expert_gate_up_scales, expert_down_packed, expert_down_scales, latent_down, latent_up, latent_norm_gain, shared_gate_up, shared_down):
// CHECK:           expert_gate_up_packed: [896,6144,1792] fp4x2 (input)
// CHECK:       _check_mx("expert_gate_up_packed", expert_gate_up_packed, "896,6144,1792", "fp4x2", dims, x.device)
// CHECK-NEXT:  _check_mx("expert_gate_up_scales", expert_gate_up_scales, "896,6144,112", "e8m0", dims, x.device)
// CHECK-NEXT:  _check_mx("expert_down_packed", expert_down_packed, "896,3584,1536", "fp4x2", dims, x.device)
// CHECK-NEXT:  _check_mx("expert_down_scales", expert_down_scales, "896,3584,96", "e8m0", dims, x.device)
// CHECK-NEXT:  _check_tensor("latent_down", latent_down, "3584,7168", "float", dims, x.device)
// CHECK-LABEL: def latent_moe_mxfp4_decode_pair_gate_up_kernel(
// CHECK:       for i_k in range(0, tl.cdiv(DIN, BD)):
// CHECK-NEXT:      o_blk = i_k * (BD // 32) + tl.arange(0, BD // 32)
// CHECK-NEXT:      m_blk = o_blk < DIN // 32
// CHECK-NEXT:      o_j = tl.arange(0, 16)
// CHECK-NEXT:      b_a_lo = tl.load(h + o_t * DIN + o_blk[:, None] * 32 + o_j[None, :], mask=m_blk[:, None], other=0.0).to(tl.float32)
// CHECK-NEXT:      b_a_hi = tl.load(h + o_t * DIN + o_blk[:, None] * 32 + 16 + o_j[None, :], mask=m_blk[:, None], other=0.0).to(tl.float32)
// CHECK-NEXT:      b_w_lo, b_w_hi = _mxfp4_dequant(tl.load(expert_gate_up_packed + i_e * 2 * DOUT * (DIN // 2) + o_n[:, None, None] * (DIN // 2) + o_blk[None, :, None] * 16 + o_j[None, None, :], mask=m_n[:, None, None] & m_blk[None, :, None], other=0), tl.load(expert_gate_up_scales + i_e * 2 * DOUT * (DIN // 32) + o_n[:, None, None] * (DIN // 32) + o_blk[None, :, None], mask=m_n[:, None, None] & m_blk[None, :, None], other=0))
// CHECK-NEXT:      b_g += tl.sum(tl.sum(b_w_lo * b_a_lo[None, :, :] + b_w_hi * b_a_hi[None, :, :], axis=2), axis=1)
// CHECK-LABEL: def latent_moe_mxfp4_decode_token_down_kernel(
// CHECK:               b_a_lo = tl.load(pair_act + (i_t * TOP_K + i_j) * DIN + o_blk[:, None] * 32 + o_j[None, :], mask=m_blk[:, None], other=0.0).to(tl.float32)
// CHECK:               b_part += tl.sum(tl.sum(b_w_lo * b_a_lo[None, :, :] + b_w_hi * b_a_hi[None, :, :], axis=2), axis=1)
// CHECK-NEXT:      b_y += tl.load(topk_weights + i_t * TOP_K + i_j) * b_part
// CHECK-LABEL: def moe(x, router_weight, router_bias, expert_gate_up_packed, expert_gate_up_scales, expert_down_packed, expert_down_scales, latent_down, latent_up, latent_norm_gain, shared_gate_up, shared_down, schedule="auto"):
// CHECK:       __all__ = ['route', 'moe_prefill', 'moe_decode', 'moe', 'pack_expert_weights']
