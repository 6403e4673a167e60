// Running a pass again does not add a second entry for a layer that already has one.
// RUN: k3c opt %s -p lower-recurrent,lower-recurrent,fuse-attnres,fuse-attnres | filecheck %s
// RUN: k3c opt %s -p lower-recurrent,fuse-attnres | k3c opt - -p lower-recurrent,fuse-attnres | filecheck %s

builtin.module {
  k3.recurrence @rec <gate = channel, delta_rule = false, num_heads = 2, num_v_heads = 2, head_k_dim = 16, head_v_dim = 16, scale = 0.25, state_layout = kv, dtype = float32>
  k3.attnres @ar <hidden_size = 64, num_blocks = 2, block_size = 3, eps = 0.001, dtype = float32>
}

// CHECK:      k3.recurrence @rec
// CHECK-NEXT: k3s.entry @rec_recurrent <source = @rec> {
// CHECK-NOT:  k3s.entry
// CHECK:      k3.attnres @ar
// CHECK-NEXT: k3s.entry @ar_aggregate <source = @ar, max_sources = 3> {
// CHECK-NOT:  k3s.entry
