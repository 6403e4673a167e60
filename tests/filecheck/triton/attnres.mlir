// The printed Triton of an AttnRes spec: one fused kernel that scores and mixes each row in a
// single read of its sources (k3c compile --stdout).
// RUN: k3c compile %examples/attnres.toml --stdout --no-autotune | filecheck %s

// CHECK:      attnres: compiled attnres layer (k3compile {{[0-9.]+}}). Needs only torch and triton.
// CHECK:      layer: k3.attnres @attnres <hidden_size = 7168, num_blocks = 8, block_size = 12, eps = 1.0e-06, dtype = bfloat16>
// CHECK:      pipeline: fuse-attnres
// CHECK-LABEL: def attnres_aggregate_kernel(
// CHECK:      # %q = k3s.fold_query %query, %gain <hidden_size = 7168>: RMSNorm gain folded into the pseudo-query
// CHECK-NEXT: b_q = tl.load(query + o_d, mask=m_d, other=0.0).to(tl.float32) * tl.load(gain + o_d, mask=m_d, other=0.0).to(tl.float32)
// the loop over sources pipelined by the kernel's num_stages: the next rows load while one is scored
// CHECK:      # %max, %sum, %acc = k3s.source_loop: each source row is read once
// CHECK-NEXT: for i_s in tl.range(0, S, num_stages=3):
// CHECK-NEXT:     b_x = tl.load(sources + (i_s * R + i_r) * D + o_d, mask=m_d, other=0.0).to(tl.float32)
// CHECK:      # %score = k3s.rms_score %x, %q <eps = 1.0e-06>: score = q . x / rms(x)
// CHECK:      # %max, %sum, %p, %rescale = k3s.online_softmax %max, %sum, %score
// CHECK:      # %acc = k3s.mix_accumulate %acc, %rescale, %p, %x
// CHECK:      # k3s.normalize_store %acc, %sum, %out
// CHECK-NEXT: tl.store(out + i_r * D + o_d, (b_acc / b_sum).to(out.dtype.element_ty), mask=m_d)
// CHECK-LABEL: def aggregate(sources, query, gain):
// CHECK:      # k3s.entry @aggregate <source = attnres, max_sources = 9>: argument checks
// CHECK:      # k3s.kernel @attnres_aggregate <grid = row, num_warps = 4, num_stages = 3, block_d = 8192>: launch
// CHECK:          num_warps=4,
// CHECK-NEXT:     num_stages=3,
// CHECK:      __all__ = ['aggregate']
