// Each pass lowers only its own layer kind: lower-recurrent leaves k3.attnres alone,
// fuse-attnres leaves k3.recurrence alone, both in one pipeline lower both, and only
// lower-moe-routing touches k3.latent_moe. Each entry follows its own layer op and, the module
// holding more than one layer, is named <layer>_<entry> so that module-level names stay distinct.
// RUN: k3c opt %s -p lower-recurrent | filecheck %s --check-prefix=REC
// RUN: k3c opt %s -p fuse-attnres | filecheck %s --check-prefix=AR
// RUN: k3c opt %s -p lower-recurrent,fuse-attnres | filecheck %s --check-prefix=BOTH
// RUN: k3c opt %s -p fuse-attnres,lower-recurrent | filecheck %s --check-prefix=BOTH
// RUN: k3c opt %s -p lower-recurrent,fuse-attnres | k3c opt - | filecheck %s --check-prefix=BOTH
// RUN: k3c opt %s -p lower-moe-routing | filecheck %s --check-prefix=MOE
// With no -p, k3c opt only parses, verifies and prints.
// RUN: k3c opt %s | filecheck %s --check-prefix=NONE

builtin.module {
  k3.recurrence @rec <gate = scalar, delta_rule = true, num_heads = 2, num_v_heads = 2, head_k_dim = 16, head_v_dim = 16, scale = 0.25, state_layout = kv, dtype = float32>
  k3.attnres @ar <hidden_size = 64, num_blocks = 2, block_size = 3, eps = 0.001, dtype = float32>
  k3.latent_moe @moe <hidden_size = 64, latent_dim = 32, num_experts = 4, top_k = 2, expert_ffn_dim = 32, num_shared_experts = 1, shared_ffn_dim = 32, activation = swiglu, norm_topk_prob = true, routed_scaling_factor = 1.0, eps = 0.001, dtype = float32>
}

// REC:      k3.recurrence @rec
// REC-NEXT: k3s.entry @rec_recurrent <source = @rec> {
// REC:      %[[g:[a-z_0-9]+]] = k3s.load_gate %g <gate = scalar
// REC-NEXT: %S_2 = k3s.decay %S_1, %[[g]] <gate = scalar> : !k3s.tile<K x V>
// REC:      k3.attnres @ar
// REC-NEXT: k3.latent_moe @moe
// REC-NOT:  k3s.entry

// AR-NOT:  k3s.entry
// AR:      k3.recurrence @rec
// AR-NEXT: k3.attnres @ar
// AR-NEXT: k3s.entry @ar_aggregate <source = @ar, max_sources = 3> {
// AR:      k3.latent_moe @moe
// AR-NOT:  k3s.entry

// BOTH:      k3.recurrence @rec
// BOTH-NEXT: k3s.entry @rec_recurrent <source = @rec> {
// BOTH:      k3s.kernel @rec_recurrent
// BOTH:      k3.attnres @ar
// BOTH-NEXT: k3s.entry @ar_aggregate <source = @ar, max_sources = 3> {
// BOTH:      k3s.kernel @ar_aggregate
// BOTH:      k3.latent_moe @moe
// BOTH-NOT:  k3s.entry

// MOE-NOT:  k3s.entry
// MOE:      k3.latent_moe @moe
// MOE-NEXT: k3s.entry @moe_route <source = @moe> {
// MOE:      k3s.kernel @moe_router_logits
// MOE:      k3s.kernel @moe_router_top_k
// MOE-NOT:  k3s.entry

// NONE-NOT: k3s.
