// derive-backward: a recurrence's `chunk_backward` entry (docs/backward.md). Its arguments are the
// forward's inputs, the cotangents of its outputs (do, dht) and the gradients of the inputs the
// member reads (dh0 optional); its k3s.chunked_backward recomputes the forward's chunk-local
// stages, runs the state scan (the state each chunk enters) and the cotangent scan (last chunk
// first, dht in, dh0 out), then the chunk-local adjoints, down to the stores of the inputs'
// cotangents. Every member; the output re-parses.
// RUN: k3c ir %examples/kda.toml -p derive-backward | filecheck %s
// RUN: k3c ir %examples/kda.toml -p derive-backward | k3c opt - | filecheck %s
// A scalar gate: its pair decays exp(G_i - G_j) and the sums over the channels of its cotangents.
// RUN: k3c ir %examples/gated_deltanet.toml -p derive-backward | filecheck %s --check-prefix=GDN
// RUN: k3c ir %examples/gated_deltanet.toml -p derive-backward | filecheck %s --check-prefix=SCALAR
// No gate: no gate stages, no gate gradient; no delta rule: no solve, no beta gradient.
// RUN: k3c ir %examples/deltanet.toml -p derive-backward | filecheck %s --check-prefix=DN
// RUN: k3c ir %examples/deltanet.toml -p derive-backward | filecheck %s --check-prefix=NOGATE
// RUN: k3c ir %examples/gla.toml -p 'derive-backward{chunk-size=32}' | filecheck %s --check-prefix=GLA
// RUN: k3c ir %examples/gla.toml -p 'derive-backward{chunk-size=32}' | filecheck %s --check-prefix=NODELTA

// CHECK-LABEL: k3s.entry @chunk_backward <source = @kda> {
// CHECK-NEXT:    %[[Q:[a-z_0-9]+]] = k3s.tensor_arg @q <role = input> : !k3s.tensor<B x T x 32 x 128, float>
// CHECK-NEXT:    %[[K:[a-z_0-9]+]] = k3s.tensor_arg @k <role = input>
// CHECK-NEXT:    %[[V:[a-z_0-9]+]] = k3s.tensor_arg @v <role = input>
// CHECK-NEXT:    %[[G:[a-z_0-9]+]] = k3s.tensor_arg @g <role = input>
// CHECK-NEXT:    %[[BETA:[a-z_0-9]+]] = k3s.tensor_arg @beta <role = input>
// CHECK-NEXT:    k3s.scalar_arg @scale
// CHECK-NEXT:    %[[H0:[a-z_0-9]+]] = k3s.tensor_arg @initial_state <role = optional_input> : !k3s.tensor<N x 32 x 128 x 128, float32>
// CHECK-NEXT:    k3s.tensor_arg @cu_seqlens <role = optional_input, purpose = sequence_offsets>
// CHECK-NEXT:    k3s.tensor_arg @A_log <role = forbidden>
// CHECK-NEXT:    k3s.tensor_arg @dt_bias <role = forbidden>
// the cotangents of the outputs: do in o's layout, dht (optional) in the final state's
// CHECK-NEXT:    %[[DO:[a-z_0-9]+]] = k3s.tensor_arg @do <role = input> : !k3s.tensor<B x T x 32 x 128, float>
// CHECK-NEXT:    %[[DHT:[a-z_0-9]+]] = k3s.tensor_arg @dht <role = optional_input> : !k3s.tensor<N x 32 x 128 x 128, float32>
// the gradients, each in its input's layout; dh0 optional
// CHECK-NEXT:    %[[DQ:[a-z_0-9]+]] = k3s.tensor_arg @dq <role = output{{.*}}> : !k3s.tensor<B x T x 32 x 128, {{float|float32}}>
// CHECK-NEXT:    %[[DK:[a-z_0-9]+]] = k3s.tensor_arg @dk <role = output{{.*}}> : !k3s.tensor<B x T x 32 x 128, {{float|float32}}>
// CHECK-NEXT:    %[[DV:[a-z_0-9]+]] = k3s.tensor_arg @dv <role = output{{.*}}> : !k3s.tensor<B x T x 32 x 128, {{float|float32}}>
// CHECK-NEXT:    %[[DG:[a-z_0-9]+]] = k3s.tensor_arg @dg <role = output{{.*}}> : !k3s.tensor<B x T x 32 x 128, {{float|float32}}>
// CHECK-NEXT:    %[[DBETA:[a-z_0-9]+]] = k3s.tensor_arg @dbeta <role = output{{.*}}> : !k3s.tensor<B x T x 32, {{float|float32}}>
// CHECK-NEXT:    %[[DH0:[a-z_0-9]+]] = k3s.tensor_arg @dh0 <role = optional_output> : !k3s.tensor<N x 32 x 128 x 128, float32>
// CHECK-NEXT:    k3s.chunked_backward <chunk_size = 16> {
// the forward's chunk-local stages, recomputed from the inputs (nothing else is saved)
// CHECK-NEXT:      %[[q:[a-z_0-9]+]] = k3s.load_chunk %[[Q]] : !k3s.tile<C x K>
// CHECK-NEXT:      %[[k:[a-z_0-9]+]] = k3s.load_chunk %[[K]] : !k3s.tile<C x K>
// CHECK-NEXT:      %[[v:[a-z_0-9]+]] = k3s.load_chunk %[[V]] : !k3s.tile<C x V>
// CHECK-NEXT:      %[[g:[a-z_0-9]+]] = k3s.load_gate %[[G]] <gate = channel, input = log, lower_bound = -5.0, floor = -110.0> : !k3s.tile<C x K>
// CHECK-NEXT:      %[[CG:[A-Za-z_0-9]+]] = k3s.gate_cumsum %[[g]] <gate = channel> : !k3s.tile<C x K>
// the Gram A = Diag(beta) M and T = (I + A)^-1 Diag(beta) as their unscaled values and the
// scalings: the adjoints read M and the inverse too (cse keeps one of each)
// CHECK:           %[[M:[A-Za-z_0-9]+]] = k3s.gram %[[k]], %[[k]], %[[CG]], {{.*}} <mask = strict, gate = channel, beta = false, diagonal = guarded>
// CHECK-NEXT:      %[[A:[A-Za-z_0-9]+]] = k3s.scale %[[M]], %{{.*}} <along = rows> : !k3s.tile<C x C>
// CHECK-NEXT:      %[[TINV:[A-Za-z_0-9]+]] = k3s.unit_lower_inverse %[[A]] <block = 1> : !k3s.tile<C x C>
// CHECK-NEXT:      %[[T:[A-Za-z_0-9]+]] = k3s.scale %[[TINV]], %{{.*}} <along = columns> : !k3s.tile<C x C>
// CHECK-NEXT:      %[[W:[A-Za-z_0-9]+]] = k3s.wy_apply %[[T]], %[[k]], %[[CG]] <gate = channel>
// CHECK-NEXT:      %[[U:[A-Za-z_0-9]+]] = k3s.wy_apply %[[T]], %[[v]] <gate = none>
// CHECK:           %[[KG:[A-Za-z_0-9]+]] = k3s.gate_apply %[[k]], %[[CG]], %{{.*}} <anchor = end, gate = channel> : !k3s.tile<C x K>
// CHECK-NEXT:      %[[GAMMA:[A-Za-z_0-9]+]] = k3s.chunk_decay %{{.*}} <gate = channel> : !k3s.tile<K>
// the state scan: the forward's state pass without its output, chunk after chunk from h0
// CHECK-NEXT:      %[[S:[A-Za-z_0-9]+]] = k3s.state_scan %[[H0]] {
// CHECK-NEXT:      ^bb0(%[[S_IN:[A-Za-z_0-9]+]]: !k3s.tile<K x V>):
// CHECK-NEXT:        %[[VR:[A-Za-z_0-9]+]] = k3s.delta_residual %[[S_IN]], %[[W]], %[[U]] : !k3s.tile<C x V>
// CHECK-NEXT:        %[[S_OUT:[A-Za-z_0-9]+]] = k3s.state_advance %[[S_IN]], %[[KG]], %[[VR]], %[[GAMMA]] <gate = channel> : !k3s.tile<K x V>
// CHECK-NEXT:        k3s.next_chunk %[[S_OUT]]
// CHECK-NEXT:      } : !k3s.tile<K x V>
// the scan's stages again, on the state each chunk enters
// CHECK-NEXT:      %[[vr:[A-Za-z_0-9]+]] = k3s.delta_residual %[[S]], %[[W]], %[[U]] : !k3s.tile<C x V>
// CHECK-NEXT:      %[[do:[a-z_0-9]+]] = k3s.load_chunk %[[DO]] : !k3s.tile<C x V>
// the cotangent scan, from the last chunk to the first: the cotangent of the state a chunk
// leaves (dht's for the last) to that of the state it enters (the first chunk's is dh0)
// CHECK-NEXT:      %[[S_BAR:[A-Za-z_0-9]+]] = k3s.cotangent_scan %[[DHT]], %[[DH0]] {
// CHECK-NEXT:      ^bb0(%[[LEAVING:[A-Za-z_0-9]+]]: !k3s.tile<K x V>):
// CHECK-NEXT:        %[[VR_BAR:[A-Za-z_0-9]+]] = k3s.dot %[[KG]], %[[LEAVING]] : !k3s.tile<C x V>
// CHECK-NEXT:        %[[DECAYED:[A-Za-z_0-9]+]] = k3s.scale %[[LEAVING]], %[[GAMMA]] <along = rows> : !k3s.tile<K x V>
// CHECK-NOT:         k3s.store_cotangent
// CHECK:             %[[WS:[A-Za-z_0-9]+]] = k3s.dot %[[W]], %{{.*}} <transpose_lhs = true> : !k3s.tile<K x V>
// CHECK-NEXT:        %[[NWS:[A-Za-z_0-9]+]] = k3s.neg %[[WS]] : !k3s.tile<K x V>
// CHECK-NEXT:        %[[ENTERING:[A-Za-z_0-9]+]] = k3s.add %{{.*}}, %[[NWS]] : !k3s.tile<K x V>
// CHECK-NEXT:        k3s.next_chunk %[[ENTERING]]
// CHECK-NEXT:      } : !k3s.tile<K x V>
// chunk-local again: the scan's adjoints on S and the cotangent of the state left
// CHECK-NEXT:      %{{[A-Za-z_0-9]+}} = k3s.dot %[[vr]], %[[S_BAR]] <transpose_rhs = true> : !k3s.tile<C x K>
// CHECK-NEXT:      %{{[A-Za-z_0-9]+}} = k3s.dot %[[KG]], %[[S_BAR]] : !k3s.tile<C x V>
// CHECK-NEXT:      %[[SS:[A-Za-z_0-9]+]] = k3s.mul %[[S_BAR]], %[[S]] : !k3s.tile<K x V>
// CHECK-NEXT:      %{{[A-Za-z_0-9]+}} = k3s.reduce_sum %[[SS]] <along = rows> : !k3s.tile<K>
// a channel gate's Grams: their cotangents contracted under the decays in the Gram's own form
// (unbounded gates: guarded by the chunk's span check, elementwise where it fails)
// CHECK:           k3s.gated_contraction %{{[A-Za-z_0-9]+}}, %{{[A-Za-z_0-9]+}}, %[[CG]], %{{[A-Za-z_0-9]+}} <side = rows, form = guarded> : !k3s.tile<C x K>
// CHECK-NEXT:      k3s.gated_contraction %{{[A-Za-z_0-9]+}}, %{{[A-Za-z_0-9]+}}, %[[CG]], %{{[A-Za-z_0-9]+}} <side = keys, form = guarded> : !k3s.tile<C x K>
// the WY factors' transform T = (I + A)^-1 Diag(beta): Y = (I + A)^-T T_bar, the recomputed
// inverse's transpose times T_bar (accurate: at least tf32); A's cotangent -Y T^T on the entries the solve
// reads, beta's the diagonal of Y
// CHECK:           %[[Y:[A-Za-z_0-9]+]] = k3s.dot %[[TINV]], %{{.*}} <transpose_lhs = true, accurate = true> : !k3s.tile<C x C>
// CHECK-NEXT:      %[[YT:[A-Za-z_0-9]+]] = k3s.dot %[[Y]], %[[T]] <transpose_rhs = true> : !k3s.tile<C x C>
// CHECK-NEXT:      %[[NYT:[A-Za-z_0-9]+]] = k3s.neg %[[YT]] : !k3s.tile<C x C>
// CHECK-NEXT:      %[[A_BAR:[A-Za-z_0-9]+]] = k3s.mask %[[NYT]] <mask = inclusive> : !k3s.tile<C x C>
// CHECK-NEXT:      %{{[A-Za-z_0-9]+}} = k3s.diagonal %[[Y]] : !k3s.tile<C>
// the key Gram's rule: M's cotangent masked as M is, beta's rows scaled
// CHECK-NEXT:      k3s.mask %[[A_BAR]] <mask = strict> : !k3s.tile<C x C>
// beta's cotangent: the row sums of A_bar times M, the recomputed M
// CHECK-NEXT:      k3s.mul %[[A_BAR]], %[[M]] : !k3s.tile<C x C>
// the cumulative gate's cotangent: G_C's onto the chunk's last row, then the reverse cumsum
// CHECK:           %[[LAST:[A-Za-z_0-9]+]] = k3s.onto_last_row %{{.*}} : !k3s.tile<C x K>
// CHECK-NEXT:      %[[G_BAR:[A-Za-z_0-9]+]] = k3s.add %{{.*}}, %[[LAST]] : !k3s.tile<C x K>
// CHECK-NEXT:      %[[g_bar:[A-Za-z_0-9]+]] = k3s.reverse_cumsum %[[G_BAR]] : !k3s.tile<C x K>
// the stores: each load's cotangent to its input's gradient, through the load's input form
// CHECK-NEXT:      k3s.store_cotangent %{{[A-Za-z_0-9]+}}, %[[DQ]], %[[Q]] <of = q>
// CHECK-NEXT:      k3s.store_cotangent %{{[A-Za-z_0-9]+}}, %[[DK]], %[[K]] <of = k>
// CHECK-NEXT:      k3s.store_cotangent %{{[A-Za-z_0-9]+}}, %[[DV]], %[[V]] <of = v>
// CHECK-NEXT:      k3s.store_cotangent %[[g_bar]], %[[DG]], %[[G]] <of = g, gate_input = log, lower_bound = -5.0, floor = -110.0>
// CHECK-NEXT:      k3s.store_cotangent %{{[A-Za-z_0-9]+}}, %[[DBETA]], %[[BETA]] <of = beta, beta_input = probability>
// CHECK-NEXT:    }
// CHECK-NEXT:  }

// GDN-LABEL: k3s.entry @chunk_backward <source = @gated_deltanet> {
// GDN:         %[[G:[a-z_0-9]+]] = k3s.tensor_arg @g <role = input> : !k3s.tensor<B x T x 32, float>
// GDN:         %[[DG:[a-z_0-9]+]] = k3s.tensor_arg @dg <role = output{{.*}}> : !k3s.tensor<B x T x 32, {{float|float32}}>
// GDN:         %[[CG:[A-Za-z_0-9]+]] = k3s.gate_cumsum %{{.*}} <gate = scalar> : !k3s.tile<C>
// GDN:         %[[GAMMA:[A-Za-z_0-9]+]] = k3s.chunk_decay %{{.*}} <gate = scalar> : !k3s.tile<>
// GDN:         %[[S:[A-Za-z_0-9]+]] = k3s.state_scan
// the state's decay is one number: the cotangent scan scales by it, its cotangent sums the whole state
// GDN:         %[[S_BAR:[A-Za-z_0-9]+]] = k3s.cotangent_scan
// GDN-NEXT:    ^bb0(%[[LEAVING:[A-Za-z_0-9]+]]: !k3s.tile<K x V>):
// GDN-NEXT:      k3s.dot
// GDN-NEXT:      k3s.scale %[[LEAVING]], %[[GAMMA]] <along = all> : !k3s.tile<K x V>
// GDN:         %[[SS:[A-Za-z_0-9]+]] = k3s.mul %[[S_BAR]], %[[S]] : !k3s.tile<K x V>
// GDN-NEXT:    k3s.reduce_sum %[[SS]] <along = all> : !k3s.tile<>
// KG = K exp(G_C - G): the gate's cotangent sums its rows' over the key channels
// GDN:         %[[KGW:[A-Za-z_0-9]+]] = k3s.mul %{{.*}}, %{{.*}} : !k3s.tile<C x K>
// GDN-NEXT:    k3s.reduce_sum %[[KGW]] <along = rows> : !k3s.tile<C>
// the query Gram (mask inclusive): its cotangent weighted by the pair decays exp(G_i - G_j), then
// contracted against the keys and the queries; G's is its weighted entries' row sums minus column sums
// GDN:         %[[PD:[A-Za-z_0-9]+]] = k3s.pair_decay %[[CG]] <mask = inclusive> : !k3s.tile<C x C>
// GDN-NEXT:    %[[Z:[A-Za-z_0-9]+]] = k3s.mul %{{.*}}, %[[PD]] : !k3s.tile<C x C>
// GDN-NEXT:    k3s.dot %[[Z]], %{{.*}} : !k3s.tile<C x K>
// GDN-NEXT:    k3s.dot %[[Z]], %{{.*}} <transpose_lhs = true> : !k3s.tile<C x K>
// GDN-NEXT:    %[[WP:[A-Za-z_0-9]+]] = k3s.mul %{{.*}}, %{{.*}} : !k3s.tile<C x C>
// GDN-NEXT:    %[[ROWS:[A-Za-z_0-9]+]] = k3s.reduce_sum %[[WP]] <along = rows> : !k3s.tile<C>
// GDN-NEXT:    %[[COLS:[A-Za-z_0-9]+]] = k3s.reduce_sum %[[WP]] <along = columns> : !k3s.tile<C>
// GDN-NEXT:    k3s.sub %[[ROWS]], %[[COLS]] : !k3s.tile<C>
// GDN:         k3s.dot %{{.*}} <transpose_lhs = true, accurate = true> : !k3s.tile<C x C>
// the key Gram's (mask strict)
// GDN:         k3s.pair_decay %[[CG]] <mask = strict> : !k3s.tile<C x C>
// GDN:         k3s.onto_last_row %{{.*}} : !k3s.tile<C>
// GDN:         %[[g_bar:[A-Za-z_0-9]+]] = k3s.reverse_cumsum %{{.*}} : !k3s.tile<C>
// GDN:         k3s.store_cotangent %[[g_bar]], %[[DG]], %[[G]] <of = g, gate_input = log, lower_bound = -5.0, floor = -110.0>
// a scalar gate's decays are pairs (never above 1): no contraction under channel decays
// SCALAR-NOT:  k3s.gated_contraction

// DN-LABEL: k3s.entry @chunk_backward <source = @deltanet> {
// DN:          %[[DH0:[a-z_0-9]+]] = k3s.tensor_arg @dh0
// DN:          k3s.state_advance %{{[A-Za-z_0-9]+}}, %{{[A-Za-z_0-9]+}}, %{{[A-Za-z_0-9]+}} <gate = none>
// the state's cotangent passes back undecayed
// DN:          k3s.cotangent_scan %{{[a-z_0-9]+}}, %[[DH0]] {
// DN-NEXT:     ^bb0(%[[LEAVING:[A-Za-z_0-9]+]]: !k3s.tile<K x V>):
// DN-NOT:      k3s.scale %[[LEAVING]]
// DN:          k3s.next_chunk
// DN:          k3s.dot %{{.*}} <transpose_lhs = true, accurate = true> : !k3s.tile<C x C>
// DN:          k3s.store_cotangent %{{.*}} <of = v>
// DN-NEXT:     k3s.store_cotangent %{{.*}} <of = beta, beta_input = probability>
// DN-NEXT:   }
// NOGATE-NOT:  @dg
// NOGATE-NOT:  k3s.chunk_decay
// NOGATE-NOT:  k3s.gated_contraction
// NOGATE-NOT:  k3s.pair_decay
// NOGATE-NOT:  k3s.onto_last_row
// NOGATE-NOT:  k3s.reverse_cumsum

// GLA-LABEL: k3s.entry @chunk_backward <source = @gla> {
// GLA:         k3s.chunked_backward <chunk_size = 32> {
// GLA:         k3s.state_scan
// GLA:         k3s.cotangent_scan
// GLA:         k3s.store_cotangent %{{.*}} <of = v>
// GLA-NEXT:    k3s.store_cotangent %{{.*}} <of = g, gate_input = log, lower_bound = -5.0, floor = -110.0>
// GLA-NEXT:  }
// NODELTA-NOT: @dbeta
// NODELTA-NOT: k3s.delta_residual
// NODELTA-NOT: k3s.forward_substitution
// NODELTA-NOT: k3s.unit_lower_inverse
