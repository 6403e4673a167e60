// The segment scan's verifiers: its body is a summary, a combine and the chunked schedule that
// finishes the segments, in that order; summary and combine hold M in the same form, one of
// full, diagonal, scalar, identity; summary and combine live only in a segment scan.
// RUN: k3c opt %s | filecheck %s --check-prefix=VALID
// RUN: sed 's/summary_combine <transition = full>/summary_combine <transition = diagonal>/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=DISAGREE
// RUN: sed 's/transition = full/transition = dense/g' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=FORM
// RUN: sed '/k3s.summary_combine/d' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=MISSING
// RUN: sed 's/^      k3s.segment_summary <transition = full>$/      k3s.summary_combine <transition = full>/; t; s/^      k3s.summary_combine <transition = full>$/      k3s.segment_summary <transition = full>/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=ORDER
// RUN: sed 's/^  k3s.entry @segment_scan <source = r> {$/  k3s.segment_summary <transition = full>\n&/' %s | not k3c opt - 2>&1 | filecheck %s --check-prefix=PARENT

builtin.module {
  k3s.entry @segment_scan <source = r> {
    k3s.segment_scan {
      k3s.segment_summary <transition = full>
      k3s.summary_combine <transition = full>
      k3s.chunked <chunk_size = 4> {
        k3s.chunk_local {
          k3s.gate_cumsum <gate = channel>
        }
        k3s.chunk_scan {
          k3s.delta_residual
        }
      }
    }
  }
}

// VALID: k3s.segment_summary <transition = full>

// DISAGREE-NOT: {{\n}}
// DISAGREE: {{^}}k3c opt: error: <stdin>: k3s.segment_scan: summary and combine disagree on the transition form (full vs diagonal){{$}}
// DISAGREE-NOT: {{.}}

// FORM-NOT: {{\n}}
// FORM: {{^}}k3c opt: error: <stdin>: k3s.segment_summary: transition must be one of full, diagonal, scalar, identity; got 'dense'{{$}}
// FORM-NOT: {{.}}

// MISSING-NOT: {{\n}}
// MISSING: {{^}}k3c opt: error: <stdin>: k3s.segment_scan: body must be segment_summary, summary_combine, chunked; got k3s.segment_summary, k3s.chunked{{$}}
// MISSING-NOT: {{.}}

// ORDER-NOT: {{\n}}
// ORDER: {{^}}k3c opt: error: <stdin>: k3s.segment_scan: body must be segment_summary, summary_combine, chunked; got k3s.summary_combine, k3s.segment_summary, k3s.chunked{{$}}
// ORDER-NOT: {{.}}

// PARENT-NOT: {{\n}}
// PARENT: {{^}}k3c opt: error: <stdin>: 'k3s.segment_summary' expects parent op 'k3s.segment_scan'{{$}}
// PARENT-NOT: {{.}}
