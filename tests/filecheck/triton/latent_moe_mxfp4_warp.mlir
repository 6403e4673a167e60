// The printed Triton of K3's LatentMoE with MXFP4 expert weights under lower-moe-experts{decode=warp}
// (examples/latent_moe_mxfp4.toml): the layer's weights are read in the words layout (the pass's
// packing = words), so the module's pack_expert_weights packs words by default and every entry
// checks the packed values as fp4x8 (int32 [E, out, in / 8]). The warp kernels load a slot tile
// of words [BJ, BN, BD / 32, 4], dequantise it by extraction (_e2m1_words: lane h of word q is
// input 16 h + 4 i + q of its block) against the activations of those columns, fp32
// multiply-and-sum, and scale each block's sum once (_mxfp4_scaled); the down kernel weights the
// activations by the routing weights on load. moe_prefill's tl.dot projections dequantise a
// [BD / 8, BN] word tile to two [BD / 2, BN] tiles (_mxfp4_words_dequant) against activations
// loaded in that tile's column order (k3c compile --stdout).
// RUN: k3c compile %examples/latent_moe_mxfp4.toml --stdout --no-autotune -p 'lower-moe-routing,lower-moe-experts{decode=warp}' | filecheck %s

// CHECK-LABEL: def pack_expert_weights(expert_gate_up, expert_down, layout=None):
// CHECK-LABEL: def _e2m1_words(words, i: tl.constexpr):
// CHECK-LABEL: def _mxfp4_scaled(partials, scales):
// CHECK-LABEL: def _mxfp4_words_dequant(words, scales):
// CHECK:       _MXFP4_PACKING = "words"
// CHECK-LABEL: def latent_moe_mxfp4_prefill_expert_gate_up_kernel(
// CHECK:       # %g, %u = k3s.project %h, %expert_gate_up_packed, %expert_gate_up_scales, %expert_offsets, %sorted_pairs, %block_expert <{{.*}}weight_format = mxfp4, packing = words>
// CHECK:       for i_k in range(0, tl.cdiv(DIN, BD)):
// CHECK-NEXT:      o_kw = i_k * (BD // 8) + tl.arange(0, BD // 8)
// CHECK-NEXT:      m_kw = o_kw < DIN // 8
// CHECK-NEXT:      # depth o_kk = 4 w + i: extraction i of word w, lane h's input 32 (w // 4) + 16 h + 4 i + w % 4
// CHECK-NEXT:      o_kk = i_k * (BD // 2) + tl.arange(0, BD // 2)
// CHECK-NEXT:      m_kk = o_kk < DIN // 2
// CHECK-NEXT:      o_k = o_kk // 16 * 32 + o_kk % 4 * 4 + o_kk // 4 % 4
// CHECK-NEXT:      b_a_lo = tl.load(h + o_t[:, None] * DIN + o_k[None, :], mask=m_s[:, None] & m_kk[None, :], other=0.0)
// CHECK-NEXT:      b_a_hi = tl.load(h + o_t[:, None] * DIN + 16 + o_k[None, :], mask=m_s[:, None] & m_kk[None, :], other=0.0)
// CHECK-NEXT:      b_w_lo, b_w_hi = _mxfp4_words_dequant(tl.load(expert_gate_up_packed + i_e * 2 * DOUT * (DIN // 8) + o_n[None, :] * (DIN // 8) + o_kw[:, None], mask=m_kw[:, None] & m_n[None, :], other=0).to(tl.uint32, bitcast=True), tl.load(expert_gate_up_scales + i_e * 2 * DOUT * (DIN // 32) + o_n[None, :] * (DIN // 32) + (o_kw // 4)[:, None], mask=m_kw[:, None] & m_n[None, :], other=0))
// CHECK-NEXT:      b_g += _mm(b_a_lo, b_w_lo, DOT) + _mm(b_a_hi, b_w_hi, DOT)
// CHECK-LABEL: def moe_prefill(
// CHECK:       _check_mx("expert_gate_up_packed", expert_gate_up_packed, "896,6144,448", "fp4x8", dims, x.device)
// CHECK-NEXT:  _check_mx("expert_gate_up_scales", expert_gate_up_scales, "896,6144,112", "e8m0", dims, x.device)
// CHECK-NEXT:  _check_mx("expert_down_packed", expert_down_packed, "896,3584,384", "fp4x8", dims, x.device)
// CHECK-LABEL: def latent_moe_mxfp4_decode_token_gate_up_kernel(
// CHECK:       # %g, %u = k3s.project_token_slots %h, %topk_ids, %expert_gate_up_packed, %expert_gate_up_scales <{{.*}}weight_format = mxfp4, packing = words>: {{.*}}; MXFP4 weights (words layout) dequantised in registers, each block's sum scaled once
// CHECK:       for i_k in range(0, tl.cdiv(DIN, BD)):
// CHECK-NEXT:      o_blk = i_k * (BD // 32) + tl.arange(0, BD // 32)
// CHECK-NEXT:      m_blk = o_blk < DIN // 32
// CHECK-NEXT:      o_q = tl.arange(0, 4)
// CHECK-NEXT:      b_words_0 = tl.load(expert_gate_up_packed + b_e[:, None, None, None] * 2 * DOUT * (DIN // 8) + o_n[None, :, None, None] * (DIN // 8) + o_blk[None, None, :, None] * 4 + o_q[None, None, None, :], mask=m_j[:, None, None, None] & m_n[None, :, None, None] & m_blk[None, None, :, None], other=0).to(tl.uint32, bitcast=True)
// CHECK-NEXT:      b_part_0 = tl.zeros([BJ, BN, BD // 32, 4], dtype=tl.float32)
// CHECK-NEXT:      b_words_1 = tl.load(expert_gate_up_packed + b_e[:, None, None, None] * 2 * DOUT * (DIN // 8) + (1 * DOUT + o_n)[None, :, None, None] * (DIN // 8)
// CHECK-NEXT:      b_part_1 = tl.zeros([BJ, BN, BD // 32, 4], dtype=tl.float32)
// CHECK-NEXT:      for i_x in tl.static_range(4):  # extraction i_x: lane h of word q is input 16 h + 4 i_x + q of its block
// CHECK-NEXT:          b_a_lo = tl.load(h + i_t * DIN + o_blk[:, None] * 32 + 4 * i_x + o_q[None, :], mask=m_blk[:, None], other=0.0).to(tl.float32)
// CHECK-NEXT:          b_a_hi = tl.load(h + i_t * DIN + o_blk[:, None] * 32 + 16 + 4 * i_x + o_q[None, :], mask=m_blk[:, None], other=0.0).to(tl.float32)
// CHECK-NEXT:          b_w_lo, b_w_hi = _e2m1_words(b_words_0, i_x)
// CHECK-NEXT:          b_part_0 += b_w_lo * b_a_lo[None, None, :, :] + b_w_hi * b_a_hi[None, None, :, :]
// CHECK-NEXT:          b_w_lo, b_w_hi = _e2m1_words(b_words_1, i_x)
// CHECK-NEXT:          b_part_1 += b_w_lo * b_a_lo[None, None, :, :] + b_w_hi * b_a_hi[None, None, :, :]
// CHECK-NEXT:      b_g += tl.sum(_mxfp4_scaled(tl.sum(b_part_0, axis=3), tl.load(expert_gate_up_scales + b_e[:, None, None] * 2 * DOUT * (DIN // 32) + o_n[None, :, None] * (DIN // 32) + o_blk[None, None, :], mask=m_j[:, None, None] & m_n[None, :, None] & m_blk[None, None, :], other=0)), axis=2)
// CHECK-NEXT:      b_u += tl.sum(_mxfp4_scaled(tl.sum(b_part_1, axis=3),
// CHECK-LABEL: def latent_moe_mxfp4_decode_token_down_kernel(
// CHECK:       b_route = tl.load(topk_weights + o_pj, mask=m_j, other=0.0)
// CHECK:               b_a_lo = tl.load(pair_act + o_pj[:, None, None] * DIN + o_blk[None, :, None] * 32 + 4 * i_x + o_q[None, None, :], mask=m_j[:, None, None] & m_blk[None, :, None], other=0.0).to(tl.float32) * b_route[:, None, None]
// CHECK:               b_part_0 += b_w_lo * b_a_lo[:, None, :, :] + b_w_hi * b_a_hi[:, None, :, :]
// CHECK:           b_teams += tl.sum(_mxfp4_scaled(tl.sum(b_part_0, axis=3), tl.load(expert_down_scales
// CHECK:       b_y = tl.sum(b_teams, axis=0)
// CHECK-LABEL: def moe_decode(
// CHECK:       _check_mx("expert_gate_up_packed", expert_gate_up_packed, "896,6144,448", "fp4x8", dims, x.device)
