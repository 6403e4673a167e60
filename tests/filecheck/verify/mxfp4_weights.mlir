// MXFP4 expert weights carry an E8M0 scale per 32 inputs, so k3.latent_moe with
// expert_weight_format = mxfp4 needs the experts' input widths in whole blocks: latent_dim (or
// hidden_size at full width) and expert_ffn_dim. The projections that read packed weights take
// their scales (after the packed values: fp4x2 values, e8m0 scales), read an expert's [E, out,
// in] layout and step over whole blocks; the words of the format are bf16 and mxfp4.
// RUN: k3c opt %s | filecheck %s --check-prefix=OK
// RUN: sed 's/expert_ffn_dim = 64/expert_ffn_dim = 48/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=FFN
// RUN: sed 's/latent_dim = 32/latent_dim = 0/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=FULL
// RUN: sed 's/expert_weight_format = mxfp4>/expert_weight_format = fp4>/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=WORD
// RUN: sed 's/%%expert_down_scales, %%topk_ids </%%topk_ids </' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=SCALES
// RUN: sed 's/%%expert_down_packed, %%expert_down_scales </%%expert_down_packed </' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=SLOT-SCALES
// RUN: sed 's/%%pair_act, %%expert_down_packed, %%expert_down_scales, %%topk_ids/%%pair_act, %%expert_down_scales, %%expert_down_packed, %%topk_ids/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=DTYPES
// RUN: sed 's/layout = expert, glu = false, weight_format/layout = dense, glu = false, weight_format/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=LAYOUT
// RUN: sed 's/in_dim = 64, out_dim = 32, top_k = 3/in_dim = 48, out_dim = 32, top_k = 3/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=SLOTS
// packing = words reads fp4x8 values (int32 words: pack_expert_weights(layout="words")), and only
// MXFP4 weights have a packing; the warp plan's stages read MXFP4 in words only.
// RUN: sed 's/top_k = 3, weight_format = mxfp4>/top_k = 3, weight_format = mxfp4, packing = words>/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=WORDS
// RUN: sed 's/x 32 x 32, fp4x2>/x 32 x 8, fp4x8>/; s/glu = false, weight_format = mxfp4>/glu = false, weight_format = mxfp4, packing = words>/; s/top_k = 3, weight_format = mxfp4>/top_k = 3, weight_format = mxfp4, packing = words>/' %s | k3c opt - | filecheck %s --check-prefix=WORDS-OK
// RUN: sed 's/top_k = 3, weight_format = mxfp4>/top_k = 3, packing = words>/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=PACKING
// RUN: sed 's/k3s.project_slots %%pair_act, %%topk_ids, %%topk_weights/k3s.sum_expert_rows %%pair_act, %%topk_ids, %%topk_weights/; s/top_k = 3, weight_format = mxfp4>/top_k = 3, slots = 2, weight_format = mxfp4, packing = nibbles>/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=WARP

builtin.module {
  k3.latent_moe @moe <hidden_size = 40, latent_dim = 32, num_experts = 8, top_k = 3, expert_ffn_dim = 64, num_shared_experts = 0, shared_ffn_dim = 0, activation = situ_glu, norm_topk_prob = true, routed_scaling_factor = 1.0, eps = 0.001, dtype = float32, expert_weight_format = mxfp4>
  k3s.entry @moe_decode <source = @moe> {
    %expert_down_packed = k3s.tensor_arg @expert_down_packed <role = input> : !k3s.tensor<8 x 32 x 32, fp4x2>
    %expert_down_scales = k3s.tensor_arg @expert_down_scales <role = input> : !k3s.tensor<8 x 32 x 2, e8m0>
    %topk_ids = k3s.tensor_arg @topk_ids <role = workspace> : !k3s.tensor<R x 3, index>
    %topk_weights = k3s.tensor_arg @topk_weights <role = workspace> : !k3s.tensor<R x 3, float32>
    %pair_act = k3s.tensor_arg @pair_act <role = workspace> : !k3s.tensor<R x 3 x 64, float>
    k3s.kernel @moe_pair_down <grid = [pair, column_block], num_warps = 4> {
      %y = k3s.project %pair_act, %expert_down_packed, %expert_down_scales, %topk_ids <in_dim = 64, out_dim = 32, rows = pair, input_index = pair, layout = expert, glu = false, weight_format = mxfp4> : !k3s.tile<M x N>
    }
    k3s.kernel @moe_token_down <grid = [token, column_block], num_warps = 4> {
      %z = k3s.project_slots %pair_act, %topk_ids, %topk_weights, %expert_down_packed, %expert_down_scales <in_dim = 64, out_dim = 32, top_k = 3, weight_format = mxfp4> : !k3s.tile<M x N>
    }
  }
}

// OK: k3.latent_moe @moe <{{.*}}expert_weight_format = mxfp4>
// FFN: k3.latent_moe @moe: expert_weight_format = mxfp4 scales blocks of 32 weights along each expert input, so expert_ffn_dim must be a multiple of 32, got 48
// FULL: k3.latent_moe @moe: expert_weight_format = mxfp4 scales blocks of 32 weights along each expert input, so hidden_size must be a multiple of 32, got 40
// WORD: k3.latent_moe{{.*}}expert_weight_format{{.*}}bf16, mxfp4
// SCALES: k3s.project: after input and weight it reads 2 tensors (scales, topk_ids: by its properties), got 1
// SLOT-SCALES: k3s.project_slots: scales is given exactly for weight_format = mxfp4
// DTYPES: k3s.project: weight_format = mxfp4 reads fp4x2 weights and e8m0 scales, got e8m0 and fp4x2
// LAYOUT: k3s.project: weight_format = mxfp4 needs layout = expert, got dense
// SLOTS: k3s.project_slots: weight_format = mxfp4 needs in_dim a multiple of 32 (a scale per 32 weights), got 48
// WORDS: k3s.project_slots: weight_format = mxfp4 reads fp4x8 weights and e8m0 scales (packing = words), got fp4x2 and e8m0
// WORDS-OK: k3s.project_slots %pair_act, %topk_ids, %topk_weights, %expert_down_packed, %expert_down_scales <in_dim = 64, out_dim = 32, top_k = 3, weight_format = mxfp4, packing = words>
// PACKING: k3s.project_slots: packing is given only with weight_format = mxfp4
// WARP: k3s.sum_expert_rows: weight_format = mxfp4 is read here in packing = words, got nibbles
