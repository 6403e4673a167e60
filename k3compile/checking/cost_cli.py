"""`k3c cost SPEC --shape B,T [--entry E] [--gpu h200|h100] [--measured KERNEL=MS]`: k3compile.cost's
table of what each kernel of a recurrence's entries moves and computes, and its roof. Bad input
is a K3Error or an argparse error: one line, exit 2, as every k3c subcommand's."""

from __future__ import annotations

from k3compile.arguments import AppendOnce, named_positive, parse_shape


def cmd_cost(args) -> int:
    from k3compile.checking.cost import CEILINGS, entry_costs, format_costs
    from k3compile.driver import schedule_for_triton
    from k3compile.spec import load_spec

    module = schedule_for_triton(load_spec(args.spec), args.pipeline, verify="off").scheduled
    batch, tokens = args.shape
    measured = dict(args.measured or ())
    tables = [format_costs(entry, entry_costs(module, entry, batch, tokens, args.dtype), CEILINGS[args.gpu], measured)
              for entry in args.entry or ("chunk", "chunk_backward")]
    print(f"B{batch} T{tokens}, {args.dtype} inputs\n\n" + "\n\n".join(tables))
    return 0


def add_parser(sub) -> None:

    p = sub.add_parser("cost", help="each kernel's bytes, FLOPs and roofline time at a shape (recurrences; "
                                    "k3compile/checking/cost.py)")
    p.add_argument("spec", help="layer spec (.toml) of a recurrence kind")
    p.add_argument("--shape", type=parse_shape, required=True, metavar="B,T", help="batch and tokens per sequence")
    p.add_argument("-p", "--pipeline", help="pass pipeline (default: the kind's)")
    p.add_argument("--entry", action=AppendOnce, help="an entry to cost (repeatable; default chunk and chunk_backward)")
    p.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16", help="input dtype")
    p.add_argument("--gpu", choices=("h200", "h100"), default="h200",
                   help="the measured ceilings to take (../.library/device/KINDS.md figures; default h200)")
    p.add_argument("--measured", type=named_positive("KERNEL=MS", "a kernel's name and its time"), action="append", metavar="KERNEL=MS",
                   help="a kernel's measured time, to print its fraction of the roof (repeatable)")
    p.set_defaults(run=cmd_cost)
