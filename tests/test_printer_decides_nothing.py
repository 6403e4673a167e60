"""The Triton printer decides nothing (issue 39): the choices it used to make are typed properties
that lower-to-triton (backends/triton/lower.py) writes on the IR, `k3c ir` shows them, and the
code that made them in the printer does not come back."""

from __future__ import annotations

import re

import pytest

from conftest import EXAMPLES, REPO, run_cli
from k3compile.default_pipelines import DEFAULT_PIPELINES

PRINTER = REPO / "backends" / "triton" / "printer"

# what the printer's code looked like where it decided: (what it decided, the file, a regex of
# that code)
REMOVED_DECISIONS = [
    ("which kernels multiply matrices (and so take DOT)", "kernels.py", r"MATMUL_STAGE_TYPES"),
    ("the products' precision by input dtype where the kernel names none", "kernels.py",
     r"kernel\.dots is not None else"),
    ("the triangular inverse's squarings, counted from the chunk's rows", "chunk_stages.py", r"while power <|power \*= 2"),
    ("the triangular inverse's products at least tf32, always", "chunk_stages.py",
     r"\"b_M = _mm_accurate\(|_mm_accurate\(b_Linv"),
    ("the value-block loops unrolled, always", "chunk_stages.py", r"for i_vb in tl\.static_range|for i_p in tl\.static_range"),
    ("a token's row converted to fp32, always", "loads.py", r"\{offsets\}, mask=\{mask\}, other=0\.0\)(\"\s*\")?\.to\(tl\.float32\)"),
    ("a Block AttnRes row's block of representatives (legalize-triton's block_s)", "kernels.py",
     r"BS=next_power_of_2"),
    ("a Block AttnRes row's block of representatives (legalize-triton's block_s)", "attnres_columns.py",
     r"BS=next_power_of_2"),
    ("a normalised chunk's rows converted to fp32 with the normalisation", "loads.py",
     r"\{target\} = \{target\}\.to\(tl\.float32\)\","),
    ("the channel-gated Gram's block loop unrolled, always", "chunk_stages.py", r"for d in tl\.static_range"),
    ("the elementwise Gram diagonal's rows reloaded, always", "chunk_stages.py",
     r"\"b_Gj = \{Gstart\}\",\s*\"for r in range\(0, SUB\):\""),
    ("a workspace's layout, as a hand-written per-token or per-chunk address", "chunk_stages.py",
     r"\* HV \+ i_hv\) \* \{|start // BC \+ i_n\) \* HV|def spill_address|def value_block_part_address|SPILL_COLUMNS"),
    ("the router's hidden slices by rows, read off its launch_by_rows ops", "moe.py", r"def print_hidden_slices"),
    ("the host sizes' formulas (NC, PB, PP)", "entries.py",
     r"dims\[\\?\"NC\\?\"\] = triton\.cdiv|dims\[\\?\"PB\\?\"\] = triton\.cdiv|dims\[\\?\"PP\\?\"\] = dims|SortPairsOp"),
    ("a float tensor's dtype, the entry's first input's", "entries.py", r"\.get\(out\.type\.dtype_class, f\"\{first\}\.dtype\"\)"),
    ("a fold of all a call's queries: their block, the next power of two (legalize-triton's block_q)", "kernels.py",
     r"next_power_of_2\(dims"),
    ("Block AttnRes's folded queries' block, at least tl.dot's 16 rows (legalize-triton's block_q)",
     "attnres_columns.py", r"max\(16, triton\.next_power_of_2"),
    ("a kernel's chunk table and checkpoints by its grid and stages (lower-to-triton's launch_params)", "kernels.py",
     r"params\.append\(\(\"chunk_table\"|issubclass\(t, k3s\.StoreCheckpointOp\)|checkpointing = any"),
    ("the run-time sizes' values, R by the entry's tensors (lower-to-triton's k3s.launch_size)", "kernels.py",
     r"runtime = \{\"T\"|'dims\[\"B\"\] \* dims\[\"T\"\]'"),
    ("an input's rows by what its load holds, as a hand-written address (lower-to-triton's layout)", "loads.py",
     r"KEY_ROWS|VALUE_ROWS|def token_rows|\* HV \+ i_hv"),
    ("the output's rows as a hand-written address (lower-to-triton's layout)", "chunk_stages.py",
     r"t_c\[:, None\] \* HV \+ i_hv\) \* V"),
    ("a readout's row as a hand-written address (lower-to-triton's layout)", "token_stages.py", r"\(t \* HV \+ i_hv\) \* V"),
    ("a gradient's rows as a hand-written address (lower-to-triton's layout)", "adjoint_stages.py",
     r"t_c\[:, None\] \* H \+ i_h|t_c \* HV \+ i_hv|t_c\[:, None\] \* HV \+ i_hv"),
    ("a checkpoint's slot guarded by the sequence offsets' name, not the chunk loop's offsets", "chunk_stages.py",
     r"\"if HAS_CU_SEQLENS:\""),
    ("the checkpoints' first slots from the sequence offsets by name", "entries.py", r"f\"cu_seqlens, dims"),
    ("a checkpoint's address, the state tile's offsets through p_state (lower-to-triton's address)", "chunk_stages.py",
     r"p_state - i_nh|tl\.store\(checkpoints \+ \(slot"),
    ("a commit kernel's key heads, H = HV where its entry reads no tokens (lower-to-triton's key_heads)", "kernels.py",
     r"reads_tokens|H=layer\.num_heads|num_heads\.value\.data if"),
    ("a kernel's parameters trimmed to the names its printed code reads (the IR gives exactly those)", "kernels.py",
     r"in printed\.read\]|if param_name\(param\) in"),
    ("the presence flags of all the entry's optional tensors, for any kernel", "kernels.py",
     r"for n in view\.optional\(\)\]"),
    ("DEPTH for every kernel of an entry with draft states", "kernels.py", r"constants\[\"DEPTH\"\] = depth"),
]


@pytest.mark.parametrize("decision, name, marker", REMOVED_DECISIONS, ids=[d for d, _, _ in REMOVED_DECISIONS])
def test_printer_makes_no_removed_decision(decision, name, marker):
    text = (PRINTER / name).read_text()
    found = [text[:match.start()].count("\n") + 1 for match in re.finditer(marker, text)]
    assert not found, f"{name} decides {decision} again (lines {found}): lower-to-triton writes it"


# the printer files lower-to-triton changed: each says it decides nothing (issue 39's list is done)
DECIDES_NOTHING = ("common.py", "loads.py", "chunk_stages.py", "kernels.py")


@pytest.mark.parametrize("name", DECIDES_NOTHING)
def test_printer_file_says_it_decides_nothing(name):
    docstring = (PRINTER / name).read_text().split('"""')[1].replace("\n", " ")
    assert "decides nothing" in docstring and "Still decided here" not in docstring


def test_k3c_ir_shows_what_the_printer_reads(capsys):
    """kda's IR after the backend's passes carries each choice as a typed property."""
    pipeline = DEFAULT_PIPELINES["kda"] + ",legalize-triton,lower-to-triton"
    code, out, err = run_cli(capsys, "ir", EXAMPLES / "kda.toml", "-p", pipeline)
    assert code == 0, err
    for shown in ("k3s.kernel @kda_chunk_prepare <grid = [chunk, value_head], num_warps = 4, dots = input,",
                  "k3s.forward_substitution %A, %beta_1 <block = 1, accurate = true, squarings = 3>",
                  "k3s.unit_lower_inverse %A <block = 1, accurate = true, squarings = 3>",
                  "k3s.load_token %q <dtype = fp32, layout = #k3s.layout<token[T], key_head[H], column[K]>>",
                  "k3s.load_chunk %v <dtype = input, layout = #k3s.layout<token[T], head[HV], column[V]>>",
                  "k3s.chunk_output %QG_1, %S_1, %P_1, %vr, %o, %scale <layout = #k3s.layout<token[T], head[HV], "
                  "column[V]>>",
                  "k3s.value_block_loop <block_v = 64, unroll = true>",
                  "diagonal = guarded, unroll = true, diagonal_rows = reload>",
                  "k3s.spill %KG, %KG_1 <layout = #k3s.layout<token[T], head[HV], column[K]>>",
                  "k3s.reload %S <layout = #k3s.layout<chunk[NC], head[HV], column[K], column[V]>>",
                  "%NC = arith.addi %1, %N : index", "k3s.bind_size %NC <symbol = NC>",
                  "k3s.tensor_arg @o <role = output, dtype_of = @q>",
                  "block_v = 64, launch_params = [T, checkpoints], key_heads = 32> {", "k3s.launch_size %T_1 <size = T>",
                  "k3s.store_checkpoint %S_2 <layout = kv, address = #k3s.layout<checkpoint[NCK], head[HV], column[K], "
                  "column[V]>>", "launch_params = [chunk_table, T], key_heads = 32> {"):
        assert shown in out, shown


def test_printer_follows_the_gram_choices(monkeypatch):
    """The Gram's block loop and its elementwise diagonal's rows as the IR says, not as the printer
    would: lower-to-triton's other choices (a loop not unrolled, rows extracted) print as such."""
    from xdsl.dialects.builtin import BoolAttr

    from k3compile.backends.triton import lower as lower_to_triton
    from k3compile.driver import lower
    from k3compile.ir import k3s
    from k3compile.spec import load_spec

    def other_choices(op, kernel):
        choices = lower_to_triton.gram_choices(op, kernel)
        if "diagonal_rows" in choices:
            choices["diagonal_rows"] = k3s.DiagonalRowsAttr(k3s.DiagonalRows.EXTRACT)
        return {**choices, "unroll": BoolAttr.from_bool(False)} if choices else choices

    monkeypatch.setitem(lower_to_triton.STAGE_CHOICES, k3s.GramOp, [other_choices])
    source = lower(load_spec(EXAMPLES / "kda.toml")).source
    assert "for d in range(1, NB):" in source and "for d in tl.static_range" not in source
    assert "b_pick = (o_r == r)" in source and "t_j = start" not in source


def test_printer_names_the_missing_pass(capsys):
    """A module printed without lower-to-triton: the printer says which pass writes what it reads."""
    from xdsl.context import Context

    from k3compile.backends.triton.legalize import LegalizeTritonPass
    from k3compile.backends.triton.printer import print_triton
    from k3compile.driver import schedule
    from k3compile.passes.outline_kernels import OutlineKernelsPass
    from k3compile.spec import load_spec

    module = schedule(load_spec(EXAMPLES / "gla.toml"), "lower-recurrent,outline-kernels").scheduled
    OutlineKernelsPass().apply(Context(), module)
    LegalizeTritonPass().apply(Context(), module)
    with pytest.raises(ValueError, match=r"k3s.load_token %q reached the Triton printer without lower-to-triton "
                                         r"\(no layout\)"):
        print_triton(module, "doc")


def test_printer_refuses_a_parameter_its_code_does_not_read(monkeypatch):
    """The printer keeps every parameter the IR gives a kernel (no trimming): one the code does
    not read is refused by the self-check (K3C_PRINTER_CHECKS=1, as the tests set it), naming it."""
    from k3compile.backends.triton.printer import common
    from k3compile.driver import lower
    from k3compile.ir import k3s
    from k3compile.spec import load_spec

    loop_constants = common.KERNEL_CONSTANTS[k3s.ChunkLoopOp]
    monkeypatch.setitem(common.KERNEL_CONSTANTS, k3s.ChunkLoopOp,
                        lambda printer, op, kernel, view: {**loop_constants(printer, op, kernel, view), "UNREAD": 1})
    with pytest.raises(ValueError, match=r"kernel @gla_chunk_scan: its code reads no UNREAD \(a parameter the IR gives"):
        lower(load_spec(EXAMPLES / "gla.toml"))
