// Bad input exits with status 2 exactly (0 ok, 1 verification of kernels failed, 2 bad input,
// 3 internal error): for an IR verification error, an unknown pass, a parse error, a missing
// file and a file that is not text.
// RUN: sh -c 'k3c opt "$1" 2>/dev/null; test $? -eq 2' sh %s
// RUN: sh -c 'sed "s/num_v_heads = 6/num_v_heads = 8/" "$1" | k3c opt - -p no-such-pass 2>/dev/null; test $? -eq 2' sh %s
// RUN: sh -c 'echo "k3.recurrence @r <gate" | k3c opt - 2>/dev/null; test $? -eq 2' sh
// RUN: sh -c 'k3c opt "$1.does-not-exist" 2>/dev/null; test $? -eq 2' sh %s
// RUN: printf 'ELF\001\377\376' > %t.bin
// RUN: sh -c 'k3c opt "$1" 2>/dev/null; test $? -eq 2' sh %t.bin
// RUN: not k3c opt %t.bin 2>&1 | filecheck %s --check-prefix=BINARY
// The control: the same file with the bad value fixed exits 0.
// RUN: sh -c 'sed "s/num_v_heads = 6/num_v_heads = 8/" "$1" | k3c opt - >/dev/null; test $? -eq 0' sh %s
// RUN: not k3c opt %s.does-not-exist 2>&1 | filecheck %s --check-prefix=MISSING

builtin.module {
  k3.recurrence @r <gate = channel, delta_rule = true, num_heads = 4, num_v_heads = 6, head_k_dim = 64, head_v_dim = 64, scale = 0.125, state_layout = kv, dtype = float32>
}

// MISSING-NOT: {{\n}}
// MISSING: {{^}}k3c opt: error: {{.*}}exit_code.mlir.does-not-exist: cannot read (No such file or directory){{$}}
// MISSING-NOT: {{.}}

// BINARY-NOT: {{\n}}
// BINARY: {{^}}k3c opt: error: {{.*}}.bin: not UTF-8 text (byte 4); expected IR (.mlir){{$}}
// BINARY-NOT: {{.}}
